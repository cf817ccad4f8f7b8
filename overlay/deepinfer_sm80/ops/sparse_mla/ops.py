"""Sparse MLA's public entry points: argument checks, output allocation, engine choice
and launch.

``sparse_mla_decode`` takes FlashMLA's sparse fp8 decode arguments (584-byte V4 records),
``sparse_mla_prefill`` its sparse prefill over vLLM's bf16 gather workspace. Each picks
its kernels through ``engine`` (TileLang where it can run, else Triton), allocates the
split partials a decode launch needs, and launches ``tilelang_kernels`` or
``triton_kernel``; split decodes on the Triton path end with its reduction kernel, the
TileLang decode merges its splits in the kernel (``tilelang_kernels.MERGE_SPLITS``).
"""

import math

import torch

from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.ops._validate import check_paged_records, check_tensor
from deepinfer_sm80.ops.kv_cache.layout import HEAD_DIM, RECORD_BYTES
from deepinfer_sm80.ops.sparse_mla import tilelang_kernels, triton_kernel
from deepinfer_sm80.ops.sparse_mla.engine import (
    decode_config_name,
    decode_engine,
    decode_rows_per_split,
    prefill_engine,
)

LOG2E = 1.4426950408889634


def _as_cache(name: str, cache: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Accept vLLM's ``[blocks, bs, 584]`` or FlashMLA's ``[blocks, bs, 1, 584]``."""
    check_tensor(name, cache, dtype=torch.uint8, ndim=(3, 4), device=device)
    if cache.dim() == 4:
        if cache.shape[2] != 1:
            raise ValueError(f"{name}: expected one KV head, got shape {tuple(cache.shape)}")
        cache = cache.squeeze(2)
    if cache.shape[-1] != RECORD_BYTES:
        raise ValueError(
            f"{name}: expected contiguous {RECORD_BYTES}-byte V4 records, got shape "
            f"{tuple(cache.shape)} (528/288-byte V4.1 records are SM100-only)"
        )
    check_paged_records(name, cache, RECORD_BYTES)
    if cache.stride(0) % 16 or cache.data_ptr() % 16:
        # The kernel loads records as 16-byte vectors; vLLM's pages always qualify.
        raise ValueError(
            f"{name}: pages must start on 16-byte boundaries (page stride "
            f"{cache.stride(0)} B, address % 16 = {cache.data_ptr() % 16}); allocate the "
            f"cache with a page stride that is a multiple of 16"
        )
    return cache


def _as_rows(name: str, idx: torch.Tensor, num_tokens: int, device: torch.device) -> torch.Tensor:
    check_tensor(name, idx, dtype=torch.int32, ndim=(2, 3), device=device)
    if idx.dim() == 3:
        if idx.shape[1] != 1:
            raise ValueError(f"{name}: expected [T, 1, W] (one KV head), got {tuple(idx.shape)}")
        idx = idx[:, 0]
    if idx.shape[0] != num_tokens or (idx.shape[1] > 0 and idx.stride(1) != 1):
        raise ValueError(
            f"{name}: expected [{num_tokens}, W] with contiguous rows, got {tuple(idx.shape)}"
        )
    return idx


def _as_lengths(
    name: str, lengths: torch.Tensor | None, num_tokens: int, device: torch.device
) -> torch.Tensor | None:
    if lengths is None:
        return None
    check_tensor(name, lengths, dtype=torch.int32, ndim=1, device=device)
    if lengths.shape[0] != num_tokens:
        raise ValueError(f"{name}: expected {num_tokens} entries, got {lengths.shape[0]}")
    if num_tokens > 1 and lengths.stride(0) != 1:
        raise ValueError(f"{name}: expected contiguous entries, got stride {lengths.stride(0)}")
    return lengths


def _check_sink(attn_sink: torch.Tensor | None, heads: int, device: torch.device) -> None:
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, dtype=torch.float32, ndim=1, device=device)
        if attn_sink.shape[0] < heads:
            raise ValueError(f"attn_sink: needs >= {heads} entries, got {attn_sink.shape[0]}")
        if heads > 1 and attn_sink.stride(0) != 1:
            raise ValueError(
                f"attn_sink: expected contiguous entries, got stride {attn_sink.stride(0)}"
            )


def sparse_mla_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    softmax_scale: float,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode straight from 584-byte V4 records (FlashMLA's sparse fp8 decode).

    Args:
        q: ``[T, Hp, 512]`` (or ``[T, 1, Hp, 512]``) bf16, heads padded to ``Hp``.
        k_cache: the layer's SWA cache ``[blocks, bs, 584]`` (or ``[blocks, bs, 1, 584]``).
        indices: ``[T, W]`` (or ``[T, 1, W]``) int32 global slots, -1 = none.
        topk_length: ``[T]`` int32 leading entries of ``indices`` to use, or None (all W).
        softmax_scale: scale of QK^T (512**-0.5 for DeepSeek-V4.1).
        attn_sink: ``[>= Hp]`` f32 per-head sink logit, denominator only; None = no sink.
        extra_k_cache, extra_indices, extra_topk_length: the compressed cache and its
            Top-K slots and lengths (None on SWA-only layers).
        out: ``[T, Hp, 512]`` bf16 written in place (rows of padded heads untouched).
        num_heads: real heads (64 / TP); heads past it are padding and get no work.

    Returns:
        ``(out, lse)``: lse ``[T, Hp]`` f32, natural log of the sum of exp(logits) (sink
        excluded; -inf for a token with no valid row; padded heads unwritten).
    """
    squeeze_q = q.dim() == 4
    if squeeze_q:
        if q.shape[1] != 1:
            raise ValueError(f"q: decode takes one query per sequence, got {tuple(q.shape)}")
        q = q[:, 0]
    check_tensor("q", q, dtype=torch.bfloat16, ndim=3)
    T, Hp, D = q.shape
    if D != HEAD_DIM or q.stride(-1) != 1:
        raise ValueError(
            f"q: expected [T, Hp, {HEAD_DIM}] with unit last stride, got {tuple(q.shape)}"
        )
    heads = Hp if num_heads is None else num_heads
    if not 0 < heads <= Hp:
        raise ValueError(f"num_heads: expected 1..{Hp} (q's padded head count), got {heads}")
    main = _as_cache("k_cache", k_cache, q.device)
    main_idx = _as_rows("indices", indices, T, q.device)
    main_len = _as_lengths("topk_length", topk_length, T, q.device)
    has_extra = extra_k_cache is not None
    if has_extra != (extra_indices is not None):
        raise ValueError("extra_k_cache and extra_indices must be given together")
    if has_extra:
        extra = _as_cache("extra_k_cache", extra_k_cache, q.device)
        extra_idx = _as_rows("extra_indices", extra_indices, T, q.device)
        extra_len = _as_lengths("extra_topk_length", extra_topk_length, T, q.device)
        if extra_len is None:
            extra_len = torch.full((T,), extra_idx.shape[1], dtype=torch.int32, device=q.device)
    else:
        extra, extra_idx, extra_len = main, main_idx, main_len
    _check_sink(attn_sink, heads, q.device)
    if main_len is None and has_extra:
        main_len = torch.full((T,), main_idx.shape[1], dtype=torch.int32, device=q.device)
    if out is None:
        out = torch.empty_like(q)
    else:
        if out.dim() == 4:
            out = out[:, 0]
        check_tensor("out", out, dtype=torch.bfloat16, ndim=3, device=q.device)
        if out.shape != q.shape or out.stride(-1) != 1:
            raise ValueError(f"out: expected shape {tuple(q.shape)}, got {tuple(out.shape)}")
    lse = torch.empty((T, Hp), dtype=torch.float32, device=q.device)
    if T == 0:
        return out, lse
    engine = decode_engine(q.device)
    _launch(
        q,
        out,
        lse,
        None,
        main,
        main_idx,
        main_len,
        extra if has_extra else None,
        extra_idx,
        extra_len,
        attn_sink,
        softmax_scale,
        heads,
        kv_fp8=True,
        rows_per_split=decode_rows_per_split(
            engine, heads, main_idx.shape[1] + (extra_idx.shape[1] if has_extra else 0)
        ),
        cfg_name=decode_config_name(engine),
        engine=engine,
    )
    return out, lse


def sparse_mla_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill over the bf16 gather workspace (FlashMLA ``sparse_prefill_fwd``).

    Args:
        q: ``[T, H, 512]`` bf16.
        kv: ``[S, 512]`` (or ``[S, 1, 512]``) bf16 rows (``dequantize_and_gather_k_cache``).
        indices: ``[T, W]`` (or ``[T, 1, W]``) int32 row ids; -1 or >= S are skipped.
        sm_scale: scale of QK^T.
        attn_sink: ``[>= H]`` f32 or None.
        topk_length: ``[T]`` int32 leading entries to use, or None (all W).
        out: ``[T, H, 512]`` bf16 written in place.

    Returns:
        ``(out, max_logits [T, H], lse [T, H])`` in natural-log units; sink excluded.
    """
    check_tensor("q", q, dtype=torch.bfloat16, ndim=3)
    T, H, D = q.shape
    if D != HEAD_DIM or q.stride(-1) != 1:
        raise ValueError(
            f"q: expected [T, H, {HEAD_DIM}] with unit last stride, got {tuple(q.shape)}"
        )
    check_tensor("kv", kv, dtype=torch.bfloat16, ndim=(2, 3), device=q.device)
    if kv.dim() == 3:
        if kv.shape[1] != 1:
            raise ValueError(f"kv: expected one KV head, got {tuple(kv.shape)}")
        kv = kv[:, 0]
    if kv.shape[-1] != HEAD_DIM or kv.stride(-1) != 1:
        raise ValueError(f"kv: expected [S, {HEAD_DIM}] rows, got {tuple(kv.shape)}")
    idx = _as_rows("indices", indices, T, q.device)
    lens = _as_lengths("topk_length", topk_length, T, q.device)
    _check_sink(attn_sink, H, q.device)
    if out is None:
        out = torch.empty_like(q)
    else:
        check_tensor("out", out, dtype=torch.bfloat16, ndim=3, device=q.device)
        if out.shape != q.shape or out.stride(-1) != 1:
            raise ValueError(f"out: expected shape {tuple(q.shape)}, got {tuple(out.shape)}")
    lse = torch.empty((T, H), dtype=torch.float32, device=q.device)
    max_logits = torch.empty_like(lse)
    if T == 0:
        return out, max_logits, lse
    # Prefill has tokens enough to fill the GPU: one split per token.
    if prefill_engine(q.device) == "tilelang":
        tilelang_kernels.launch_prefill(
            q, out, lse, max_logits, kv, idx, lens, attn_sink, sm_scale * LOG2E, H
        )
        return out, max_logits, lse
    _launch(
        q,
        out,
        lse,
        max_logits,
        kv,
        idx,
        lens,
        None,
        idx,
        lens,
        attn_sink,
        sm_scale,
        H,
        kv_fp8=False,
        rows_per_split=max(idx.shape[1], 1),
        cfg_name="sparse_mla.prefill",
    )
    return out, max_logits, lse


def _launch(
    q,
    out,
    lse,
    max_logits,
    main,
    main_idx,
    main_len,
    extra,
    extra_idx,
    extra_len,
    attn_sink,
    scale,
    heads,
    *,
    kv_fp8,
    rows_per_split,
    cfg_name,
    engine="triton",
):
    """One attention launch on validated tensors: the split partials (when a token can
    have more than one split), the engine's kernel, then the Triton reduction unless the
    TileLang decode merged the splits itself."""
    T = q.shape[0]
    main_width = main_idx.shape[1]
    extra_width = extra_idx.shape[1] if extra is not None else 0
    max_splits = max(1, math.ceil((main_width + extra_width) / rows_per_split))
    if max_splits > 1:
        part_acc = torch.empty((T, heads, max_splits, 512), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((T, heads, max_splits, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = lse  # never touched
    merged = False
    if engine == "tilelang":
        counters = None
        if max_splits > 1 and tilelang_kernels.MERGE_SPLITS:
            counters = tilelang_kernels.split_counters(
                q.device, tilelang_kernels.counter_slots(T, heads)
            )
            merged = True
        tilelang_kernels.launch(
            q,
            out,
            lse,
            main,
            main_idx,
            main_len,
            extra,
            extra_idx,
            extra_len,
            attn_sink,
            scale * LOG2E,
            heads,
            rows_per_split,
            kernel_config(cfg_name).constexpr_dict()["PREFETCH"],
            part_acc,
            part_ml,
            counters,
        )
    else:
        triton_kernel.launch(
            q,
            out,
            lse,
            max_logits,
            main,
            main_idx,
            main_len,
            extra,
            extra_idx,
            extra_len,
            attn_sink,
            scale * LOG2E,
            heads,
            part_acc,
            part_ml,
            kv_fp8=kv_fp8,
            rows_per_split=rows_per_split,
            max_splits=max_splits,
            cfg_name=cfg_name,
        )
    if max_splits > 1 and not merged:
        triton_kernel.launch_reduce(
            out,
            lse,
            part_acc,
            part_ml,
            main_idx,
            main_len,
            extra,
            extra_idx,
            extra_len,
            attn_sink,
            heads,
            rows_per_split=rows_per_split,
            max_splits=max_splits,
        )


__all__ = ["sparse_mla_decode", "sparse_mla_prefill"]
