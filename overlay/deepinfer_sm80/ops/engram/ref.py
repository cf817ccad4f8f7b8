"""PyTorch references for the Engram table lookup (FP8 rows with per-32 UE8M0 scales).

An Engram table holds ``DIM`` e4m3fn bytes per row plus ``DIM // QUANT_BLOCK`` UE8M0
scale bytes. A lookup either dequantizes the rows to bf16 or copies them packed
(values, then scales). Rows whose id the shard does not own come out as zeros.

Bit-exact by construction: torch decodes e4m3fn exactly to fp32 (0x7F/0xFF -> NaN), a
UE8M0 byte ``s`` is exactly ``2**(s-127)`` in fp32 (0 -> +0.0 and 255 -> +inf, the
kernels' bit-shift decode), and the one fp32 multiply is exact unless it leaves fp32's
normal range, where IEEE rounding is the same on CPU and GPU. The product is rounded
to bf16 once, nearest-even, as ``.to(torch.bfloat16)`` and Triton both do.
"""

import torch

from deepinfer_sm80.ops.fp8.ref import e4m3_decode_ref, ue8m0_decode_ref


def dequantize_rows_ref(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``[..., DIM]`` e4m3fn bytes and ``[..., DIM // QB]`` UE8M0 bytes -> bf16 ``[..., DIM]``.

    Op order: decode e4m3 to fp32, decode the scale to fp32, multiply in fp32, round
    the product to bf16 (nearest-even).
    """
    dim, groups = values.shape[-1], scales.shape[-1]
    decoded = e4m3_decode_ref(values.view(torch.uint8))
    scale = ue8m0_decode_ref(scales).repeat_interleave(dim // groups, dim=-1)
    return (decoded * scale).to(torch.bfloat16)


def table_rows_ref(
    weight: torch.Tensor,
    scales: torch.Tensor,
    local: torch.Tensor,
    owned: torch.Tensor,
    packed: bool,
) -> torch.Tensor:
    """Rows ``local`` of one shard's table; rows not ``owned`` are all zero bytes.

    Returns bf16 ``[..., DIM]``, or, if ``packed``, uint8 ``[..., DIM + DIM // QB]``
    (the row's e4m3 bytes followed by its scale bytes).
    """
    values = weight.view(torch.uint8)[torch.where(owned, local, 0)]
    row_scales = scales[torch.where(owned, local, 0)]
    values = torch.where(owned[..., None], values, 0)
    row_scales = torch.where(owned[..., None], row_scales, 0)
    if packed:
        return torch.cat([values, row_scales], dim=-1)
    return dequantize_rows_ref(values, row_scales)


def head_lookup_ref(
    weight: torch.Tensor,
    scales: torch.Tensor,
    ids: torch.Tensor,
    vocab_start: int,
    vocab_end: int,
    head_start: int,
    local_heads: int,
    packed: bool = False,
) -> torch.Tensor:
    """One shard's heads of every token: ``[T, local_heads, DIM]`` bf16 (or packed uint8).

    ``ids`` is ``[T, total_heads]`` global row ids (int32/int64). The shard owns heads
    ``[head_start, head_start + local_heads)``; a head past ``total_heads`` (the padding
    of the last shard) and an id outside ``[vocab_start, vocab_end)`` (dead tokens write
    -1, other shards' rows are out of range) give a zero row. ``weight`` holds the
    shard's rows ``vocab_start ..``, one ``DIM``-byte row each.
    """
    total_heads = ids.shape[1]
    heads = torch.arange(head_start, head_start + local_heads, device=ids.device)
    real = heads < total_heads
    index = ids[:, heads.clamp(max=total_heads - 1)].long()
    owned = real[None, :] & (index >= vocab_start) & (index < vocab_end)
    return table_rows_ref(weight, scales, index - vocab_start, owned, packed)


def sorted_lookup_ref(
    weight: torch.Tensor,
    scales: torch.Tensor,
    local_ids: torch.Tensor,
    destinations: torch.Tensor,
    num_rows: int,
    vocab_rows: int,
    packed: bool = False,
) -> torch.Tensor:
    """Table-order lookup: row ``destinations[i]`` of the ``[num_rows, ...]`` result is
    table row ``local_ids[i]`` (relative to the shard's first row), zeros where
    ``local_ids[i]`` is outside ``[0, vocab_rows)`` (-1 pads absent heads).

    Rows no ``destinations`` entry names are NaN (bf16) or 0xFF (packed), like a
    poisoned output a kernel never wrote.
    """
    local = local_ids.long()
    owned = (local >= 0) & (local < vocab_rows)
    rows = table_rows_ref(weight, scales, local, owned, packed)
    if packed:
        out = torch.full((num_rows, rows.shape[-1]), 0xFF, dtype=torch.uint8, device=rows.device)
    else:
        out = rows.new_full((num_rows, rows.shape[-1]), float("nan"))
    out[destinations.long()] = rows
    return out


def peer_table_ref(
    buffers: list[torch.Tensor], peer_rows: int, dim: int, quant_block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate row-sharded peer buffers into one (weight, scales) table.

    Each buffer holds ``peer_rows`` rows of ``dim`` e4m3 bytes, then their scale bytes;
    global row ``r`` lives in buffer ``r // peer_rows`` at row ``r % peer_rows``.
    """
    weights, scales = [], []
    for buffer in buffers:
        weights.append(buffer[: peer_rows * dim].view(peer_rows, dim))
        scales.append(buffer[peer_rows * dim :][: peer_rows * (dim // quant_block)])
    weight = torch.cat(weights)
    scale = torch.cat(scales).view(-1, dim // quant_block)
    return weight, scale


__all__ = [
    "dequantize_rows_ref",
    "head_lookup_ref",
    "peer_table_ref",
    "sorted_lookup_ref",
    "table_rows_ref",
]
