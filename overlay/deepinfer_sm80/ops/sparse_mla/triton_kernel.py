"""Unified 512-dim sparse MLA for sm80/sm86: decode from fp8 V4 records, and prefill.

One kernel body serves both. A program owns one query token, ``BLOCK_H`` heads and one
split of the token's selected rows; it walks the split in tiles of ``BLOCK_N`` rows:

- decode (``KV_FP8``): each row is a 584-byte V4 record, loaded as 16-byte vectors.
  The 448 NoPE bytes are decoded on chip -- four e4m3 bytes and their UE8M0 scale per
  packed PTX block (``ops/fp8.e4m3_ue8m0_to_bf16``: byte shuffles, bit masks and two
  bf16x2 FMAs, bit-exact) -- into the same ``[BLOCK_N, 512]`` tile that receives the 64
  bf16 RoPE values, so QK and PV are each one bf16 Tensor Core dot over the full 512
  width (V = K in MLA). Rows come from the SWA cache first, then from the optional
  compressed ("extra") cache, as one virtual list.
- prefill: rows are bf16 rows of the gather workspace vLLM builds.

Online softmax in base 2 with fp32 accumulators; the sink enters only the denominator.
``PREFETCH`` pipelines the loop by hand (the next tile's loads are issued before this
tile's math); ``arch.py`` says where it fits Ampere.

Split-K is batch-invariant: a token's split count is ``cdiv(own selected rows,
ROWS_PER_SPLIT)`` (``arch.py``), never a function of the batch. A token with one split
writes its final output directly; the reduction kernel runs only when some token can
have more than one split (``max splits > 1`` from the index widths), and skips tokens
that had one. The TileLang decode merges its splits in the kernel instead
(``tilelang_decode.MERGE_SPLITS``). No host sync and no data-dependent allocation: CUDA-graph safe.
"""

import importlib.util
import logging
import math
import sys

import torch
import triton
import triton.language as tl

from deepinfer_sm80 import envs
from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops._triton_utils import INTERPRETING, mma
from deepinfer_sm80.ops._validate import check_paged_records, check_tensor
from deepinfer_sm80.ops.fp8.triton_fp8 import e4m3_ue8m0_to_bf16
from deepinfer_sm80.ops.kv_cache.layout import HEAD_DIM, RECORD_BYTES
from deepinfer_sm80.ops.sparse_mla import tilelang_decode
from deepinfer_sm80.ops.sparse_mla.tilelang_decode import DSPARK_SWA_WIDTH_K5

LOG2E = 1.4426950408889634
NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity" keeps exp2(m_old - m_new) NaN-free


@triton.jit
def _tile_slots(i_t, r0, r_end, rows, HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows ``[r0, r0 + BLOCK_N)`` of a token's virtual row list (SWA rows, then the
    compressed cache's): each row's slot in its own cache, whether it is a main-cache
    row, and whether it is valid (in range, not -1, inside the cache). ``rows`` is the
    kernel's index-argument tuple (see ``sparse_mla_fwd_kernel``)."""
    (
        main_len,
        main_idx_ptr,
        main_idx_stride,
        main_rows,
        extra_idx_ptr,
        extra_idx_stride,
        extra_rows,
    ) = rows
    o_r = r0 + tl.arange(0, BLOCK_N)
    in_r = o_r < r_end
    is_main = o_r < main_len
    slot = tl.load(main_idx_ptr + i_t * main_idx_stride + o_r, mask=in_r & is_main, other=-1)
    valid = is_main & (slot >= 0) & (slot < main_rows)
    if HAS_EXTRA:
        e_slot = tl.load(
            extra_idx_ptr + i_t * extra_idx_stride + (o_r - main_len),
            mask=in_r & ~is_main,
            other=-1,
        )
        valid = valid | (~is_main & (e_slot >= 0) & (e_slot < extra_rows))
        slot = tl.where(is_main, slot, e_slot)
    valid = in_r & valid
    return tl.where(valid, slot, 0), is_main, valid


@triton.jit
def _tile_load(
    slot,
    is_main,
    valid,
    caches,
    MAIN_BLOCK_SIZE: tl.constexpr,
    EXTRA_BLOCK_SIZE: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """Issue a tile's loads; invalid rows never touch memory. ``caches`` is
    ``(main_ptr, main_stride, extra_ptr, extra_stride)``.

    Decode (``KV_FP8``): the V4 records, undecoded, as ``[rows, 8 groups, 64]`` e4m3
    bytes (group 7, the RoPE part's place, is 0), ``[rows, 8, 1]`` scale bytes and
    ``[rows, 1, 64]`` bf16 RoPE values -- fewer registers held across the pipelined loop
    than full ``[rows, 512]`` tiles. Pages are 16-byte aligned (the wrapper checks), so
    records load as 16-byte vectors. Prefill: the bf16 workspace rows ``[rows, 512]``
    (returned three times: the two others are unused placeholders of fixed type)."""
    main_ptr, main_stride, extra_ptr, extra_stride = caches
    if KV_FP8:
        p_rec, p_scale = _row_pointers(main_ptr, main_stride, slot, MAIN_BLOCK_SIZE)
        if HAS_EXTRA:
            e_rec, e_scale = _row_pointers(extra_ptr, extra_stride, slot, EXTRA_BLOCK_SIZE)
            p_rec = tl.where(is_main, p_rec, e_rec)
            p_scale = tl.where(is_main, p_scale, e_scale)
        p_rec = tl.multiple_of(p_rec, 16)
        p_scale = tl.multiple_of(p_scale, 8)
        o_g = tl.arange(0, 8)[None, :, None]
        o_c = tl.arange(0, 64)[None, None, :]
        m_row = valid[:, None, None]
        b_data = tl.load(p_rec[:, None, None] + o_g * 64 + o_c, mask=m_row & (o_g < 7), other=0)
        b_scale = tl.load(p_scale[:, None, None] + o_g, mask=m_row, other=0)
        p_rope = (p_rec + 448).to(tl.pointer_type(tl.bfloat16))
        b_rope = tl.load(p_rope[:, None, None] + o_c, mask=m_row, other=0.0)
        return b_data, b_scale, b_rope
    else:
        o_d = tl.arange(0, 512)
        p_row = main_ptr + slot.to(tl.int64) * main_stride
        b_k = tl.load(p_row[:, None] + o_d[None, :], mask=valid[:, None], other=0.0)
        return b_k, b_k, b_k


@triton.jit
def _decode_fp8_tile(b_data, b_scale, b_rope, BLOCK_N: tl.constexpr):
    """One bf16 ``[BLOCK_N, 512]`` tile: columns 0-447 the e4m3 bytes times their
    64-column group's UE8M0 scale, 448-511 the RoPE values."""
    b_nope = e4m3_ue8m0_to_bf16(b_data, tl.broadcast_to(b_scale, b_data.shape))
    is_rope = (tl.arange(0, 8) == 7)[None, :, None]
    b_k = tl.where(is_rope, tl.broadcast_to(b_rope, b_data.shape), b_nope)
    return tl.reshape(b_k, (BLOCK_N, 512))


@triton.jit
def _row_pointers(cache_ptr, page_stride, slot, BLOCK_SIZE: tl.constexpr):
    page = (slot // BLOCK_SIZE).to(tl.int64)
    within = slot % BLOCK_SIZE
    p_page = cache_ptr + page * page_stride
    return p_page + within * 576, p_page + BLOCK_SIZE * 576 + within * 8


@triton.jit
def _token_rows(
    i_t,
    main_len_ptr,
    extra_len_ptr,
    MAIN_WIDTH: tl.constexpr,
    EXTRA_WIDTH: tl.constexpr,
    HAS_LEN: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    ROWS_PER_SPLIT: tl.constexpr,
):
    """A token's selected rows per cache and its split count -- the one place both the
    attention and the reduction kernel read them from, so they always agree. Lengths are
    kept within the index widths: a longer length would read past the index row."""
    if HAS_LEN:
        main_len = tl.minimum(tl.maximum(tl.load(main_len_ptr + i_t), 0), MAIN_WIDTH)
    else:
        main_len = MAIN_WIDTH
    extra_len = 0
    if HAS_EXTRA:
        extra_len = tl.minimum(tl.maximum(tl.load(extra_len_ptr + i_t), 0), EXTRA_WIDTH)
    n_splits = tl.maximum(tl.cdiv(main_len + extra_len, ROWS_PER_SPLIT), 1)
    return main_len, extra_len, n_splits


@triton.jit(do_not_specialize=["num_tokens"])
def sparse_mla_fwd_kernel(
    q_ptr,
    q_stride_t,
    q_stride_h,
    out_ptr,
    out_stride_t,
    out_stride_h,
    lse_ptr,
    lse_stride_t,
    maxl_ptr,
    part_acc_ptr,
    part_ml_ptr,
    main_ptr,
    main_stride,
    main_rows,
    main_idx_ptr,
    main_idx_stride,
    main_len_ptr,
    extra_ptr,
    extra_stride,
    extra_rows,
    extra_idx_ptr,
    extra_idx_stride,
    extra_len_ptr,
    sink_ptr,
    scale_log2,
    num_heads,
    num_tokens,
    MAIN_WIDTH: tl.constexpr,
    EXTRA_WIDTH: tl.constexpr,
    MAIN_BLOCK_SIZE: tl.constexpr,
    EXTRA_BLOCK_SIZE: tl.constexpr,
    KV_FP8: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr,
    STORE_MAX: tl.constexpr,
    ROWS_PER_SPLIT: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    i_s = tl.program_id(2)

    main_len, extra_len, n_splits = _token_rows(
        i_t,
        main_len_ptr,
        extra_len_ptr,
        MAIN_WIDTH,
        EXTRA_WIDTH,
        HAS_LEN,
        HAS_EXTRA,
        ROWS_PER_SPLIT,
    )
    total = main_len + extra_len
    if i_s >= n_splits:
        return

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < num_heads
    o_d = tl.arange(0, 512)
    b_q = tl.load(
        q_ptr + i_t * q_stride_t + o_h[:, None] * q_stride_h + o_d[None, :],
        mask=m_h[:, None],
        other=0.0,
    )  # [BLOCK_H, 512] bf16

    b_m = tl.full((BLOCK_H,), NEG_BIG, tl.float32)
    b_l = tl.zeros((BLOCK_H,), tl.float32)
    b_acc = tl.zeros((BLOCK_H, 512), tl.float32)

    r_begin = i_s * ROWS_PER_SPLIT
    r_end = tl.minimum(r_begin + ROWS_PER_SPLIT, total)
    rows = (
        main_len,
        main_idx_ptr,
        main_idx_stride,
        main_rows,
        extra_idx_ptr,
        extra_idx_stride,
        extra_rows,
    )
    caches = (main_ptr, main_stride, extra_ptr, extra_stride)
    # PREFETCH: a software pipeline by hand. While tile i computes, tile i+1's records
    # and tile i+2's slots are in flight (their loads are issued before this tile's
    # math); without it each tile waits for two dependent global loads (slot, then
    # record). It holds a tile's undecoded bytes in registers across the loop, so it
    # is on only where the config still fits Ampere without spills (arch.py).
    if PREFETCH:
        slot, is_main, valid = _tile_slots(i_t, r_begin, r_end, rows, HAS_EXTRA, BLOCK_N)
        b_data, b_scale, b_rope = _tile_load(
            slot, is_main, valid, caches, MAIN_BLOCK_SIZE, EXTRA_BLOCK_SIZE, HAS_EXTRA, KV_FP8
        )
        slot_n, is_main_n, valid_n = _tile_slots(
            i_t, r_begin + BLOCK_N, r_end, rows, HAS_EXTRA, BLOCK_N
        )
    for r0 in range(r_begin, r_end, BLOCK_N):
        if PREFETCH:
            n_data, n_scale, n_rope = _tile_load(
                slot_n, is_main_n, valid_n, caches, MAIN_BLOCK_SIZE, EXTRA_BLOCK_SIZE,
                HAS_EXTRA, KV_FP8,
            )  # fmt: skip
            slot_nn, is_main_nn, valid_nn = _tile_slots(
                i_t, r0 + 2 * BLOCK_N, r_end, rows, HAS_EXTRA, BLOCK_N
            )
        else:
            slot, is_main, valid = _tile_slots(i_t, r0, r_end, rows, HAS_EXTRA, BLOCK_N)
            b_data, b_scale, b_rope = _tile_load(
                slot, is_main, valid, caches, MAIN_BLOCK_SIZE, EXTRA_BLOCK_SIZE, HAS_EXTRA,
                KV_FP8,
            )  # fmt: skip
        if KV_FP8:
            b_k = _decode_fp8_tile(b_data, b_scale, b_rope, BLOCK_N)
        else:
            b_k = b_data
        b_s = mma(b_q, tl.trans(b_k)) * scale_log2  # [BLOCK_H, BLOCK_N], base-2 logits
        b_s = tl.where(valid[None, :], b_s, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_alpha = tl.exp2(b_m - b_m_new)
        b_p = tl.exp2(b_s - b_m_new[:, None])
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        b_acc = b_acc * b_alpha[:, None] + mma(b_p.to(tl.bfloat16), b_k)
        b_m = b_m_new
        if PREFETCH:
            b_data, b_scale, b_rope, valid = n_data, n_scale, n_rope, valid_n
            slot_n, is_main_n, valid_n = slot_nn, is_main_nn, valid_nn

    if n_splits == 1:
        _finish(
            b_acc,
            b_m,
            b_l,
            o_h,
            m_h,
            i_t,
            out_ptr,
            out_stride_t,
            out_stride_h,
            lse_ptr,
            lse_stride_t,
            maxl_ptr,
            sink_ptr,
            HAS_SINK,
            STORE_MAX,
        )
    else:
        # Partials: unnormalized acc plus (m, l), reduced by sparse_mla_reduce_kernel.
        row = (i_t * num_heads + o_h) * MAX_SPLITS + i_s  # [BLOCK_H]
        tl.store(
            part_acc_ptr + row.to(tl.int64)[:, None] * 512 + o_d[None, :], b_acc, mask=m_h[:, None]
        )
        tl.store(part_ml_ptr + row * 2, b_m, mask=m_h)
        tl.store(part_ml_ptr + row * 2 + 1, b_l, mask=m_h)


@triton.jit
def _finish(
    b_acc,
    b_m,
    b_l,
    o_h,
    m_h,
    i_t,
    out_ptr,
    out_stride_t,
    out_stride_h,
    lse_ptr,
    lse_stride_t,
    maxl_ptr,
    sink_ptr,
    HAS_SINK: tl.constexpr,
    STORE_MAX: tl.constexpr,
):
    """Normalize (sink in the denominator only); write out, lse and optionally the max
    logit (natural log units; -inf for a token without rows)."""
    has_rows = b_l > 0.0
    if STORE_MAX:
        maxl = tl.where(has_rows, b_m / 1.4426950408889634, float("-inf"))
        tl.store(maxl_ptr + i_t * lse_stride_t + o_h, maxl, mask=m_h)
    lse = tl.where(
        has_rows, (b_m + tl.log2(tl.where(has_rows, b_l, 1.0))) / 1.4426950408889634, float("-inf")
    )
    if HAS_SINK:
        b_sink = tl.load(sink_ptr + o_h, mask=m_h, other=0.0) * 1.4426950408889634
        b_m_f = tl.maximum(b_m, b_sink)
        b_alpha = tl.exp2(b_m - b_m_f)
        b_den = b_l * b_alpha + tl.exp2(b_sink - b_m_f)
    else:
        b_alpha = tl.full(b_l.shape, 1.0, tl.float32)
        b_den = b_l
    b_den = tl.where(b_den > 0.0, b_den, 1.0)  # no rows, no sink: output 0
    b_out = b_acc * (b_alpha / b_den)[:, None]
    o_d = tl.arange(0, 512)
    tl.store(
        out_ptr + i_t * out_stride_t + o_h[:, None] * out_stride_h + o_d[None, :],
        b_out.to(tl.bfloat16),
        mask=m_h[:, None],
    )
    tl.store(lse_ptr + i_t * lse_stride_t + o_h, lse, mask=m_h)


@triton.jit
def _split_partial(
    part_ml_ptr, part_acc_ptr, i_t, o_h, m_h, s, n_splits, num_heads, MAX_SPLITS: tl.constexpr
):
    """Split ``s``'s partials (m, l, acc) of heads ``o_h``; a split past ``n_splits`` (or
    a padded head) is empty: m = NEG_BIG, l = 0, acc = 0."""
    ok = m_h & (s < n_splits)
    row = (i_t * num_heads + o_h) * MAX_SPLITS + s
    s_m = tl.load(part_ml_ptr + row * 2, mask=ok, other=NEG_BIG)
    s_l = tl.load(part_ml_ptr + row * 2 + 1, mask=ok, other=0.0)
    o_d = tl.arange(0, 512)
    s_acc = tl.load(
        part_acc_ptr + row.to(tl.int64)[:, None] * 512 + o_d[None, :], mask=ok[:, None], other=0.0
    )
    return s_m, s_l, s_acc


@triton.jit
def sparse_mla_reduce_kernel(
    out_ptr,
    out_stride_t,
    out_stride_h,
    lse_ptr,
    lse_stride_t,
    part_acc_ptr,
    part_ml_ptr,
    main_len_ptr,
    extra_len_ptr,
    sink_ptr,
    num_heads,
    MAIN_WIDTH: tl.constexpr,
    EXTRA_WIDTH: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr,
    ROWS_PER_SPLIT: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Merge a token's split partials in split order (a fixed fold: deterministic)."""
    i_t = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    _, _, n_splits = _token_rows(
        i_t,
        main_len_ptr,
        extra_len_ptr,
        MAIN_WIDTH,
        EXTRA_WIDTH,
        HAS_LEN,
        HAS_EXTRA,
        ROWS_PER_SPLIT,
    )
    if n_splits > 1:
        o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
        m_h = o_h < num_heads
        b_m = tl.full((BLOCK_H,), NEG_BIG, tl.float32)
        b_l = tl.zeros((BLOCK_H,), tl.float32)
        b_acc = tl.zeros((BLOCK_H, 512), tl.float32)
        # Four splits per step, all loaded before any is used: one memory round trip per
        # four splits instead of one per split. At T=1 the reduction is a chain of such
        # round trips (Nsight Compute, H200: 6.5 us for 4 splits); end to end this saves
        # 0.3-1 us per decode call (NVIDIA_H200.sparse_mla_reduce_four_splits.log).
        # Absent splits load as empty.
        for s0 in range(0, n_splits, 4):
            m0, l0, acc0 = _split_partial(
                part_ml_ptr, part_acc_ptr, i_t, o_h, m_h, s0, n_splits, num_heads, MAX_SPLITS
            )
            m1, l1, acc1 = _split_partial(
                part_ml_ptr, part_acc_ptr, i_t, o_h, m_h, s0 + 1, n_splits, num_heads, MAX_SPLITS
            )
            m2, l2, acc2 = _split_partial(
                part_ml_ptr, part_acc_ptr, i_t, o_h, m_h, s0 + 2, n_splits, num_heads, MAX_SPLITS
            )
            m3, l3, acc3 = _split_partial(
                part_ml_ptr, part_acc_ptr, i_t, o_h, m_h, s0 + 3, n_splits, num_heads, MAX_SPLITS
            )
            # One fixed fold per step (the same bits on every run and in any batch).
            b_m_new = tl.maximum(tl.maximum(b_m, tl.maximum(m0, m1)), tl.maximum(m2, m3))
            a_old = tl.exp2(b_m - b_m_new)
            a0 = tl.exp2(m0 - b_m_new)
            a1 = tl.exp2(m1 - b_m_new)
            a2 = tl.exp2(m2 - b_m_new)
            a3 = tl.exp2(m3 - b_m_new)
            b_l = b_l * a_old + ((l0 * a0 + l1 * a1) + (l2 * a2 + l3 * a3))
            b_acc = b_acc * a_old[:, None] + (
                (acc0 * a0[:, None] + acc1 * a1[:, None])
                + (acc2 * a2[:, None] + acc3 * a3[:, None])
            )
            b_m = b_m_new
        _finish(
            b_acc,
            b_m,
            b_l,
            o_h,
            m_h,
            i_t,
            out_ptr,
            out_stride_t,
            out_stride_h,
            lse_ptr,
            lse_stride_t,
            lse_ptr,
            sink_ptr,
            HAS_SINK,
            False,
        )


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
    cfg_name = "sparse_mla.decode" if engine == "triton" else "sparse_mla.decode_tilelang"
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
        cfg_name=cfg_name,
        engine=engine,
    )
    return out, lse


DECODE_ENGINE_ENV = "DEEPINFER_SPARSE_MLA_DECODE"
PREFILL_ENGINE_ENV = "DEEPINFER_SPARSE_MLA_PREFILL"
DECODE_SPLITS_ENV = "DEEPINFER_SPARSE_MLA_DECODE_SPLITS"


def decode_split_mode() -> str:
    """``DEEPINFER_SPARSE_MLA_DECODE_SPLITS``: ``latency`` (default) or ``throughput``.
    A deployment setting, fixed for the server's life: a token's split count still depends
    only on its own rows, so outputs stay batch-invariant in either mode."""
    return envs.choice(DECODE_SPLITS_ENV)


def decode_rows_per_split(engine: str, heads: int, width: int) -> int:
    """Rows per split of a decode launch: arch.py's ``ROWS_PER_SPLIT``, or in throughput
    mode, for the TileLang kernels and index rows wider than that,
    ``THROUGHPUT_ROWS_PER_SPLIT``. Fewer splits cut each split's fixed cost (row
    resolution, partials, the merge) at large batches and lengthen a small batch's longest
    CTA. The Triton kernel (the fallback, and the interpreter's path) keeps
    ROWS_PER_SPLIT: the throughput split was measured for the TileLang kernels only, both
    of which fit a 640-row split in 48 KB. ``heads`` is for the warning."""
    cfg_name = "sparse_mla.decode" if engine == "triton" else "sparse_mla.decode_tilelang"
    cfg = kernel_config(cfg_name).constexpr_dict()
    rps = cfg["ROWS_PER_SPLIT"]
    if decode_split_mode() == "latency" or width <= rps:
        return rps
    if engine != "tilelang":
        _warn_once(
            f"{DECODE_SPLITS_ENV}=throughput applies to the TileLang kernels; {heads} heads "
            f"on the {engine} kernel keep {rps} rows per split"
        )
        return rps
    return cfg["THROUGHPUT_ROWS_PER_SPLIT"]


def decode_engine(device: torch.device) -> str:
    """Which decode kernel runs: ``tilelang`` (``decode_sm80.cuh``, one warp per 64-dim
    scale group) where it can (a CUDA device of compute capability 8.0+, TileLang
    installed, no Triton interpreter), else ``triton`` (this module's unified kernel).
    ``DEEPINFER_SPARSE_MLA_DECODE=triton|tilelang`` forces one; forcing ``tilelang``
    where it cannot run is refused with the reason."""
    return _engine(device, DECODE_ENGINE_ENV, "decode")


def prefill_engine(device: torch.device) -> str:
    """The same choice for prefill (``DEEPINFER_SPARSE_MLA_PREFILL``): ``tilelang`` runs
    ``decode_sm80.cuh``'s kernels over the bf16 rows, ``triton`` this module's."""
    return _engine(device, PREFILL_ENGINE_ENV, "prefill")


def _engine(device: torch.device, env: str, what: str) -> str:
    choice = envs.choice(env)
    if choice == "triton":
        return choice
    why_not = _tilelang_unusable(device)
    if why_not is None:
        return "tilelang"
    if choice == "tilelang":
        raise ValueError(f"{env}=tilelang: {why_not}; unset it or choose triton")
    if device.type == "cuda" and not INTERPRETING:  # auto fell back on a GPU: say so once
        _warn_once(f"sparse MLA {what} runs the Triton kernel: {why_not}")
    return "triton"


def _tilelang_unusable(device: torch.device) -> str | None:
    """Why the TileLang kernels cannot run on ``device`` (None = they can)."""
    if device.type != "cuda" or INTERPRETING:
        return f"it needs a CUDA device without TRITON_INTERPRET (got {device})"
    if "tilelang" not in sys.modules and importlib.util.find_spec("tilelang") is None:
        return "TileLang is not installed (pip install tilelang==0.1.12, as vLLM 0.33.0 pins)"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"it needs compute capability 8.0 or newer (this GPU is {major}.{minor})"
    return None


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logging.getLogger("deepinfer_sm80.sparse_mla").warning(message)


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
        tilelang_decode.launch_prefill(
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
    T = q.shape[0]
    cfg = kernel_config(cfg_name)
    block_h = cfg.constexpr_dict()["BLOCK_H"]
    block_n = cfg.constexpr_dict()["BLOCK_N"]
    main_width = main_idx.shape[1]
    extra_width = extra_idx.shape[1] if extra is not None else 0
    max_splits = max(1, math.ceil((main_width + extra_width) / rows_per_split))
    if max_splits > 1:
        part_acc = torch.empty((T, heads, max_splits, 512), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((T, heads, max_splits, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = lse  # never touched
    if kv_fp8:
        main_rows = main.shape[0] * main.shape[1]
        extra_rows = extra.shape[0] * extra.shape[1] if extra is not None else 0
        main_bs, extra_bs = main.shape[1], extra.shape[1] if extra is not None else 1
    else:
        main_rows, extra_rows, main_bs, extra_bs = main.shape[0], 0, 1, 1
    head_blocks = triton.cdiv(heads, block_h)
    meta = dict(
        MAIN_WIDTH=main_width,
        EXTRA_WIDTH=extra_width,
        HAS_EXTRA=extra is not None,
        HAS_LEN=main_len is not None,
        HAS_SINK=attn_sink is not None,
        ROWS_PER_SPLIT=rows_per_split,
        MAX_SPLITS=max_splits,
        BLOCK_H=block_h,
    )
    merged = False
    if engine == "tilelang":
        counters = None
        if max_splits > 1 and tilelang_decode.MERGE_SPLITS:
            counters = tilelang_decode.split_counters(
                q.device, tilelang_decode.counter_slots(T, heads)
            )
            merged = True
        tilelang_decode.launch(
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
            cfg.constexpr_dict()["PREFETCH"],
            part_acc,
            part_ml,
            counters,
        )
    else:
        sparse_mla_fwd_kernel[(T, head_blocks, max_splits)](
            q,
            q.stride(0),
            q.stride(1),
            out,
            out.stride(0),
            out.stride(1),
            lse,
            lse.stride(0),
            max_logits if max_logits is not None else lse,
            part_acc,
            part_ml,
            main,
            main.stride(0),
            main_rows,
            main_idx,
            main_idx.stride(0),
            main_len if main_len is not None else main_idx,
            extra if extra is not None else main,
            extra.stride(0) if extra is not None else 0,
            extra_rows,
            extra_idx,
            extra_idx.stride(0),
            extra_len if extra_len is not None else main_idx,
            attn_sink if attn_sink is not None else lse,
            scale * LOG2E,
            heads,
            T,
            MAIN_BLOCK_SIZE=main_bs,
            EXTRA_BLOCK_SIZE=extra_bs,
            KV_FP8=kv_fp8,
            STORE_MAX=max_logits is not None,
            BLOCK_N=block_n,
            PREFETCH=bool(cfg.constexpr_dict()["PREFETCH"]),
            **cfg.launch_options(),
            **meta,
        )
    if max_splits > 1 and not merged:
        red = kernel_config("sparse_mla.reduce")
        meta.pop("BLOCK_H")
        rb = red.constexpr_dict()["BLOCK_H"]
        sparse_mla_reduce_kernel[(T, triton.cdiv(heads, rb))](
            out,
            out.stride(0),
            out.stride(1),
            lse,
            lse.stride(0),
            part_acc,
            part_ml,
            main_len if main_len is not None else main_idx,
            extra_len if extra_len is not None else main_idx,
            attn_sink if attn_sink is not None else lse,
            heads,
            BLOCK_H=rb,
            **red.launch_options(),
            **meta,
        )


_MODULE = "deepinfer_sm80.ops.sparse_mla.triton_kernel"


def ampere_kernel_specs() -> list[KernelSpec]:
    """Shipped configs at DeepSeek-V4.1 widths: SWA 128 (+ DSpark 192), Top-K 512."""

    def _fwd_spec(label, cfg_name, *, fp8, main_width, extra_width, block_size, rows_per_split):
        cfg = kernel_config(cfg_name)
        splits = max(1, math.ceil((main_width + extra_width) / rows_per_split))
        return KernelSpec.from_jit(
            label,
            f"{_MODULE}:sparse_mla_fwd_kernel",
            pointers={
                "q_ptr": "*bf16",
                "out_ptr": "*bf16",
                "lse_ptr": "*fp32",
                "maxl_ptr": "*fp32",
                "part_acc_ptr": "*fp32",
                "part_ml_ptr": "*fp32",
                "main_ptr": "*u8" if fp8 else "*bf16",
                "main_idx_ptr": "*i32",
                "main_len_ptr": "*i32",
                "extra_ptr": "*u8",
                "extra_idx_ptr": "*i32",
                "extra_len_ptr": "*i32",
                "sink_ptr": "*fp32",
            },
            scalars={"scale_log2": "fp32"},
            constexprs={
                "MAIN_WIDTH": main_width,
                "EXTRA_WIDTH": extra_width,
                "MAIN_BLOCK_SIZE": block_size,
                "EXTRA_BLOCK_SIZE": block_size // 2 or 1,
                "KV_FP8": fp8,
                "HAS_EXTRA": extra_width > 0,
                "HAS_LEN": True,
                "HAS_SINK": True,
                "STORE_MAX": not fp8,
                "ROWS_PER_SPLIT": rows_per_split,
                "MAX_SPLITS": splits,
                "BLOCK_H": cfg.constexpr_dict()["BLOCK_H"],
                "BLOCK_N": cfg.constexpr_dict()["BLOCK_N"],
                "PREFETCH": bool(cfg.constexpr_dict()["PREFETCH"]),
            },
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            maxnreg=cfg.maxnreg,
            min_ctas_per_sm=2,
            ints_divisible_by_16=(
                "q_stride_t",
                "q_stride_h",
                "out_stride_t",
                "out_stride_h",
                "main_stride",
                "extra_stride",
                "main_idx_stride",
                "extra_idx_stride",
            ),
        )

    rps = kernel_config("sparse_mla.decode").constexpr_dict()["ROWS_PER_SPLIT"]
    # The reduction merges the Triton decode's partials, and the TileLang decode's when
    # tilelang_decode.MERGE_SPLITS is off: one spec per split size.
    reduce_rps = sorted(
        {
            kernel_config(name).constexpr_dict()["ROWS_PER_SPLIT"]
            for name in ("sparse_mla.decode", "sparse_mla.decode_tilelang")
        }
    )
    specs = [
        _fwd_spec(
            "sparse_mla.decode[swa128]",
            "sparse_mla.decode",
            fp8=True,
            main_width=128,
            extra_width=0,
            block_size=256,
            rows_per_split=rps,
        ),
        _fwd_spec(
            "sparse_mla.decode[swa128+topk512]",
            "sparse_mla.decode",
            fp8=True,
            main_width=128,
            extra_width=512,
            block_size=256,
            rows_per_split=rps,
        ),
        _fwd_spec(
            "sparse_mla.decode[dspark192]",
            "sparse_mla.decode",
            fp8=True,
            main_width=DSPARK_SWA_WIDTH_K5,
            extra_width=0,
            block_size=256,
            rows_per_split=rps,
        ),
        _fwd_spec(
            "sparse_mla.prefill[640]",
            "sparse_mla.prefill",
            fp8=False,
            main_width=640,
            extra_width=0,
            block_size=1,
            rows_per_split=640,
        ),
    ]
    red = kernel_config("sparse_mla.reduce")
    for r in reduce_rps:
        specs.append(
            KernelSpec.from_jit(
                "sparse_mla.reduce[640]" + ("" if r == rps else f"[r{r}]"),
                f"{_MODULE}:sparse_mla_reduce_kernel",
                pointers={
                    "out_ptr": "*bf16",
                    "lse_ptr": "*fp32",
                    "part_acc_ptr": "*fp32",
                    "part_ml_ptr": "*fp32",
                    "main_len_ptr": "*i32",
                    "extra_len_ptr": "*i32",
                    "sink_ptr": "*fp32",
                },
                constexprs={
                    "MAIN_WIDTH": 128,
                    "EXTRA_WIDTH": 512,
                    "HAS_EXTRA": True,
                    "HAS_LEN": True,
                    "HAS_SINK": True,
                    "ROWS_PER_SPLIT": r,
                    "MAX_SPLITS": math.ceil(640 / r),
                    "BLOCK_H": red.constexpr_dict()["BLOCK_H"],
                },
                num_warps=red.num_warps,
                num_stages=red.num_stages,
                ints_divisible_by_16=("out_stride_t", "out_stride_h"),
            )
        )
    return specs


__all__ = ["ampere_kernel_specs", "sparse_mla_decode", "sparse_mla_prefill"]
