"""Sparse MLA's Triton kernels for sm80/sm86: decode from fp8 V4 records, and prefill.

The interpreter-checked path and the fallback where the TileLang kernels cannot run
(``engine.py`` chooses; ``ops.py`` holds the public entry points and calls ``launch`` and
``launch_reduce`` here on validated tensors).

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
(``tilelang_kernels.MERGE_SPLITS``). No host sync and no data-dependent allocation: CUDA-graph safe.
"""

import math

import triton
import triton.language as tl

from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops._triton_utils import mma
from deepinfer_sm80.ops.fp8.triton_fp8 import e4m3_ue8m0_to_bf16
from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import DSPARK_SWA_WIDTH_K5

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


def _shape_meta(main_idx, main_len, extra, extra_idx, attn_sink, rows_per_split, max_splits):
    """The constexprs both kernels take from a launch's shapes and optional inputs."""
    return dict(
        MAIN_WIDTH=main_idx.shape[1],
        EXTRA_WIDTH=extra_idx.shape[1] if extra is not None else 0,
        HAS_EXTRA=extra is not None,
        HAS_LEN=main_len is not None,
        HAS_SINK=attn_sink is not None,
        ROWS_PER_SPLIT=rows_per_split,
        MAX_SPLITS=max_splits,
    )


def launch(
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
    scale_log2,
    heads,
    part_acc,
    part_ml,
    *,
    kv_fp8,
    rows_per_split,
    max_splits,
    cfg_name,
):
    """Run ``sparse_mla_fwd_kernel`` on tensors ``ops.py`` has validated: decode
    (``kv_fp8``) over ``[blocks, bs, 584]`` record caches, prefill over ``[S, 512]`` bf16
    rows. A token with one split writes ``out``/``lse`` (and ``max_logits`` when given);
    with more, its splits write ``part_acc``/``part_ml`` for ``launch_reduce``."""
    T = q.shape[0]
    cfg = kernel_config(cfg_name)
    block_h = cfg.constexpr_dict()["BLOCK_H"]
    block_n = cfg.constexpr_dict()["BLOCK_N"]
    if kv_fp8:
        main_rows = main.shape[0] * main.shape[1]
        extra_rows = extra.shape[0] * extra.shape[1] if extra is not None else 0
        main_bs, extra_bs = main.shape[1], extra.shape[1] if extra is not None else 1
    else:
        main_rows, extra_rows, main_bs, extra_bs = main.shape[0], 0, 1, 1
    head_blocks = triton.cdiv(heads, block_h)
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
        scale_log2,
        heads,
        T,
        MAIN_BLOCK_SIZE=main_bs,
        EXTRA_BLOCK_SIZE=extra_bs,
        KV_FP8=kv_fp8,
        STORE_MAX=max_logits is not None,
        BLOCK_N=block_n,
        PREFETCH=bool(cfg.constexpr_dict()["PREFETCH"]),
        BLOCK_H=block_h,
        **cfg.launch_options(),
        **_shape_meta(main_idx, main_len, extra, extra_idx, attn_sink, rows_per_split, max_splits),
    )


def launch_reduce(
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
    *,
    rows_per_split,
    max_splits,
):
    """Merge the split partials of a decode launch (``sparse_mla_reduce_kernel``) into
    ``out``/``lse``; tokens that had one split are skipped."""
    T = out.shape[0]
    red = kernel_config("sparse_mla.reduce")
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
        **_shape_meta(main_idx, main_len, extra, extra_idx, attn_sink, rows_per_split, max_splits),
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
    # tilelang_kernels.MERGE_SPLITS is off: one spec per split size.
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


__all__ = ["ampere_kernel_specs", "launch", "launch_reduce"]
