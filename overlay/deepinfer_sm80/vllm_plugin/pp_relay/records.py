"""Per-token cache records as bytes: gather them out of a paged cache, scatter them back.

A paged cache is ``[num_blocks, block_size, width]`` uint8 whose pages sit
``stride(0)`` bytes apart (vLLM packs several layers' pages into one block, so the
stride is often larger than ``block_size * width``). Inside a page the writers of
vLLM 0.33.0 split a record into a *data* part, stored record after record from the
page start, and a *scale* part, stored record after record right after all the data
parts (``fused_compress_quant_cache.py``, ``indexer_k_store.py``). For slot ``s``,
``b, o = divmod(s, block_size)``:

- data bytes  ``[b * stride + o * data,                     + data)``
- scale bytes ``[b * stride + block_size * data + o * scale, + scale)``

Relaying those bytes slot by slot reproduces the record on a rank whose pages have
another stride: nothing here depends on how a rank packs its blocks.

Everything is fixed-shape torch with no host synchronisation (no boolean indexing,
no ``.item()``), so it can run inside a captured CUDA graph. Slots < 0 are skipped:
their payload rows are zero and unpacking never writes for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RecordLayout:
    """How one ``width``-byte record is split inside a page."""

    name: str
    data_bytes: int
    scale_bytes: int

    @property
    def width(self) -> int:
        return self.data_bytes + self.scale_bytes


# Every record format vLLM 0.33.0 writes into a DeepSeek-V4.1 compressed-KV or index-K
# cache on CUDA, keyed by the cache's last dimension. Ampere writes 584 and 132 only.
LAYOUTS: dict[int, RecordLayout] = {
    584: RecordLayout("v4 compressed kv (fp8_ds_mla: 448 e4m3 + 64 bf16 rope | 8 ue8m0)", 576, 8),
    528: RecordLayout("v4.1 compressed kv, mxfp8 (sm100)", 528, 0),
    288: RecordLayout("v4.1 compressed kv, nvfp4 (sm100)", 288, 0),
    132: RecordLayout("index k, fp8 (128 e4m3 | fp32 scale)", 128, 4),
    68: RecordLayout("index k, mxfp4 (64 e2m1x2 | 4 ue8m0)", 64, 4),
    # Plain compressed rows (--kv-cache-dtype auto / per-tensor fp8), viewed as bytes.
    1024: RecordLayout("compressed kv, plain bf16 row", 1024, 0),
    512: RecordLayout("compressed kv, plain fp8 row", 512, 0),
}


def layout_for(cache: torch.Tensor, name: str = "cache") -> RecordLayout:
    """The record layout of a paged cache, or a clear error for an unknown one."""
    if cache.dtype != torch.uint8 or cache.dim() != 3:
        raise ValueError(
            f"{name}: expected a [num_blocks, block_size, width] uint8 paged cache, got "
            f"{cache.dtype} of shape {tuple(cache.shape)}"
        )
    width = cache.shape[-1]
    if width not in LAYOUTS:
        raise ValueError(
            f"{name}: no known record layout is {width} bytes wide (known: "
            f"{sorted(LAYOUTS)}); a new vLLM cache format needs a layout here before it "
            "can be relayed"
        )
    if cache.stride(-1) != 1 or cache.stride(1) != width:
        raise ValueError(f"{name}: records must be contiguous bytes, got strides {cache.stride()}")
    if cache.stride(0) < cache.shape[1] * width:
        raise ValueError(
            f"{name}: page stride {cache.stride(0)} B is smaller than block_size "
            f"{cache.shape[1]} x {width} B; pass the page-strided cache vLLM allocates"
        )
    return LAYOUTS[width]


def _flat_pages(cache: torch.Tensor) -> torch.Tensor:
    """All bytes of the cache's pages as one 1-D view (pages may be padded)."""
    num_blocks, stride = cache.shape[0], cache.stride(0)
    return cache.as_strided((num_blocks * stride,), (1,))


def _byte_index(layout: RecordLayout, block_size: int, stride: int, slots: torch.Tensor):
    """``[n, width]`` int64 byte offsets of each slot's record (slots must be >= 0)."""
    slots = slots.to(torch.int64)
    block = torch.div(slots, block_size, rounding_mode="floor")
    within = slots - block * block_size
    base = (block * stride).unsqueeze(1)
    data = torch.arange(layout.data_bytes, device=slots.device)
    parts = [base + (within * layout.data_bytes).unsqueeze(1) + data]
    if layout.scale_bytes:
        scale = torch.arange(layout.scale_bytes, device=slots.device)
        scale_start = block_size * layout.data_bytes + within * layout.scale_bytes
        parts.append(base + scale_start.unsqueeze(1) + scale)
    return torch.cat(parts, dim=1)


def _check_slots(slots: torch.Tensor, rows: int, name: str) -> None:
    if slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"{name}: expected a 1-D int32/int64 slot mapping, got {slots.dtype} of shape "
            f"{tuple(slots.shape)}"
        )
    if slots.shape[0] > rows:
        raise ValueError(
            f"{name}: {slots.shape[0]} slots do not fit the payload's {rows} rows; size the "
            "payload for the padded token count"
        )


def pack_records(cache: torch.Tensor, slots: torch.Tensor, out: torch.Tensor) -> None:
    """``out[i]`` = the record at ``slots[i]`` (zeros where the slot is < 0 and for rows
    past ``len(slots)``).

    Args:
        cache: ``[num_blocks, block_size, width]`` uint8 paged cache (source layer's).
        slots: ``[n]`` int32/int64 slot mapping of this step, -1 = no record.
        out: ``[B >= n, width]`` uint8 payload rows (fixed B keeps CUDA graphs valid).
    """
    layout = layout_for(cache)
    if out.dtype != torch.uint8 or out.dim() != 2 or out.shape[1] != layout.width:
        raise ValueError(
            f"out: expected [rows, {layout.width}] uint8, got {out.dtype} {tuple(out.shape)}"
        )
    _check_slots(slots, out.shape[0], "slots")
    n = slots.shape[0]
    out[n:].zero_()
    if n == 0:
        return
    valid = (slots >= 0).unsqueeze(1)
    index = _byte_index(layout, cache.shape[1], cache.stride(0), slots.clamp(min=0))
    got = _flat_pages(cache)[index]
    out[:n] = torch.where(valid, got, torch.zeros_like(got))


def unpack_records(payload: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor) -> None:
    """Write ``payload[i]`` as the record at ``slots[i]`` for every slot >= 0.

    Rows with a negative slot write nothing. Without a host sync they cannot simply
    be dropped, so they repeat the first valid row (same slot, same bytes: a duplicate
    write of identical bytes is deterministic); when no slot is valid every row
    rewrites slot 0 with the bytes it already holds.
    """
    layout = layout_for(cache)
    if payload.dtype != torch.uint8 or payload.dim() != 2 or payload.shape[1] != layout.width:
        raise ValueError(
            f"payload: expected [rows, {layout.width}] uint8 to match the cache's records, "
            f"got {payload.dtype} {tuple(payload.shape)}"
        )
    _check_slots(slots, payload.shape[0], "slots")
    n = slots.shape[0]
    if n == 0:
        return
    flat = _flat_pages(cache)
    valid = slots >= 0
    first = torch.argmax(valid.to(torch.int32))  # 0 when none is valid
    row = torch.where(valid, torch.arange(n, device=slots.device), first)
    slot = torch.where(valid, slots, slots[first].clamp(min=0)).to(torch.int64)
    index = _byte_index(layout, cache.shape[1], cache.stride(0), slot)
    values = payload[:n][row]
    values = torch.where(valid.any(), values, flat[index])
    flat.index_put_((index,), values)


def pack_rows(buffer: torch.Tensor, out: torch.Tensor, row_src: torch.Tensor | None = None):
    """``out[i] = buffer[row_src[i]]`` (identity when ``row_src`` is None); a negative
    source row gives zeros. For token-indexed side buffers (candidate blocks, top-k)."""
    if out.dim() != 2 or buffer.dim() != 2 or out.shape[1] != buffer.shape[1]:
        raise ValueError(
            f"out: expected [rows, {buffer.shape[1]}] like the buffer's rows, got "
            f"{tuple(out.shape)}"
        )
    if out.dtype != buffer.dtype:
        raise ValueError(f"out: dtype {out.dtype} differs from the buffer's {buffer.dtype}")
    if row_src is None:
        rows = min(out.shape[0], buffer.shape[0])
        out[:rows] = buffer[:rows]
        out[rows:].zero_()
        return
    _check_slots(row_src, out.shape[0], "row_src")
    n = row_src.shape[0]
    got = buffer[row_src.clamp(min=0).to(torch.int64)]
    out[:n] = torch.where((row_src >= 0).unsqueeze(1), got, torch.zeros_like(got))
    out[n:].zero_()


def unpack_rows(payload: torch.Tensor, buffer: torch.Tensor, row_dst: torch.Tensor | None = None):
    """``buffer[row_dst[i]] = payload[i]`` for every ``row_dst[i] >= 0`` (identity when
    None: the first ``min(rows)`` rows are copied)."""
    if payload.dim() != 2 or payload.shape[1] != buffer.shape[1]:
        raise ValueError(
            f"payload: expected [rows, {buffer.shape[1]}] like the buffer's rows, got "
            f"{tuple(payload.shape)}"
        )
    if row_dst is None:
        rows = min(payload.shape[0], buffer.shape[0])
        buffer[:rows] = payload[:rows]
        return
    _check_slots(row_dst, payload.shape[0], "row_dst")
    n = row_dst.shape[0]
    if n == 0:
        return
    valid = row_dst >= 0
    first = torch.argmax(valid.to(torch.int32))
    row = torch.where(valid, torch.arange(n, device=row_dst.device), first)
    dst = torch.where(valid, row_dst, row_dst[first].clamp(min=0)).to(torch.int64)
    values = torch.where(valid.any(), payload[:n][row], buffer[dst])
    buffer.index_put_((dst,), values)


def candidate_rows(
    num_rows: int,
    num_decode_tokens: int,
    decode_lens: torch.Tensor | None,
    padded: bool,
) -> torch.Tensor | None:
    """Where each token's candidate row sits in the buffer once the source indexer ran:
    the consumer view that ``pack_rows``/``unpack_rows`` take as a row map.

    vLLM 0.33.0's indexer writes prefill rows token-absolute (``token_start:token_end``)
    and then decode rows ``[0, B * Lmax)`` in its *padded* layout whenever decode
    lengths are uneven (``needs_padded_path``; ``Lmax = max(decode_lens)``): request
    ``b``'s ``p``-th decode token lands on row ``b * Lmax + p``. Later indexers read
    the buffer in the same layout. With uneven lengths ``B * Lmax`` may exceed the
    token count, so relaying rows ``[0, n)`` would drop real decode rows.

    Returns ``None`` when the layout is the identity (no decode tokens, or uniform
    decode: every FULL-graph DSpark step); else an int64 map ``[num_rows]``: padded
    row for decode tokens, the token's own row for the rest. Device ops only, no host
    sync. Every entry is gathered from the sender's final buffer, so two tokens that
    map to one row (the upstream quirk where padded decode rows overwrite the first
    prefill rows) carry the same value and the scatter is order-free.
    """
    if not padded or num_decode_tokens == 0:
        return None
    if decode_lens is None or decode_lens.dim() != 1 or decode_lens.numel() == 0:
        raise ValueError(
            "decode_lens: a padded decode layout needs the per-request decode lengths "
            f"[num_decodes], got {None if decode_lens is None else tuple(decode_lens.shape)}"
        )
    if num_decode_tokens > num_rows:
        raise ValueError(
            f"num_decode_tokens: {num_decode_tokens} decode tokens do not fit {num_rows} rows"
        )
    lens = decode_lens.to(torch.int64)
    ends = torch.cumsum(lens, 0)
    width = lens.max()
    token = torch.arange(num_rows, device=lens.device)
    request = torch.searchsorted(ends, token, right=True).clamp(max=lens.numel() - 1)
    padded_row = request * width + (token - (ends[request] - lens[request]))
    return torch.where(token < num_decode_tokens, padded_row, token)
