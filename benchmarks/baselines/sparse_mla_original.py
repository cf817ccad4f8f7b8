"""Baseline for the sparse-MLA decode benchmark: the original DeepInfer-SM80 baseline's
algorithm, so the speed-up compares algorithms, not tuning.

What makes it the baseline (it lacks the original's optimization 1): NoPE and RoPE are separate dot
paths (q_nope.k_nope + q_rope.k_rope, two PV accumulators), UE8M0 scales are decoded
with ``exp2(s - 127)`` on the transcendental unit, and every call ends with a reduction
launch (split-K partials always go through memory). e4m3 is decoded in software because
sm80 has no fp8 type. Tile sizes match the shipped kernel's so only the algorithm
differs. Benchmark-only code: not part of the overlay.
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.ops.fp8.triton_fp8 import e4m3_to_f32


@triton.jit
def _baseline_decode_kernel(
    q_ptr, q_stride_t, q_stride_h, part_acc_ptr, part_ml_ptr,
    main_ptr, main_stride, main_idx_ptr, main_idx_stride, main_len_ptr,
    extra_ptr, extra_stride, extra_idx_ptr, extra_idx_stride, extra_len_ptr,
    scale_log2, num_heads,
    MAIN_BS: tl.constexpr, EXTRA_BS: tl.constexpr, HAS_EXTRA: tl.constexpr,
    ROWS_PER_SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    i_t = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    i_s = tl.program_id(2)
    main_len = tl.load(main_len_ptr + i_t)
    extra_len = 0
    if HAS_EXTRA:
        extra_len = tl.load(extra_len_ptr + i_t)
    total = main_len + extra_len
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < num_heads
    o_n = tl.arange(0, 512)  # NoPE columns (448 used)
    o_r = tl.arange(0, 64)
    p_q = q_ptr + i_t * q_stride_t + o_h[:, None] * q_stride_h
    q_nope = tl.load(p_q + o_n[None, :], mask=m_h[:, None] & (o_n < 448)[None, :], other=0.0)
    q_rope = tl.load(p_q + 448 + o_r[None, :], mask=m_h[:, None], other=0.0)
    b_m = tl.full((BLOCK_H,), -1.0e30, tl.float32)
    b_l = tl.zeros((BLOCK_H,), tl.float32)
    acc_n = tl.zeros((BLOCK_H, 512), tl.float32)
    acc_r = tl.zeros((BLOCK_H, 64), tl.float32)
    r_begin = i_s * ROWS_PER_SPLIT
    r_end = tl.minimum(r_begin + ROWS_PER_SPLIT, total)
    for r0 in range(r_begin, r_end, BLOCK_N):
        rr = r0 + tl.arange(0, BLOCK_N)
        in_r = rr < r_end
        is_main = rr < main_len
        slot = tl.load(main_idx_ptr + i_t * main_idx_stride + rr, mask=in_r & is_main, other=-1)
        p_page = main_ptr + (slot // MAIN_BS).to(tl.int64) * main_stride
        p_rec = p_page + (slot % MAIN_BS) * 576
        p_sc = p_page + MAIN_BS * 576 + (slot % MAIN_BS) * 8
        if HAS_EXTRA:
            e_slot = tl.load(
                extra_idx_ptr + i_t * extra_idx_stride + rr - main_len,
                mask=in_r & ~is_main,
                other=-1,
            )
            e_page = extra_ptr + (e_slot // EXTRA_BS).to(tl.int64) * extra_stride
            p_rec = tl.where(is_main, p_rec, e_page + (e_slot % EXTRA_BS) * 576)
            p_sc = tl.where(is_main, p_sc, e_page + EXTRA_BS * 576 + (e_slot % EXTRA_BS) * 8)
            slot = tl.where(is_main, slot, e_slot)
        valid = in_r & (slot >= 0)
        m_nope = valid[:, None] & (o_n < 448)[None, :]
        x = tl.load(p_rec[:, None] + o_n[None, :], mask=m_nope, other=0)
        s_byte = tl.load(p_sc[:, None] + (o_n // 64)[None, :], mask=m_nope, other=127)
        k_nope = (e4m3_to_f32(x) * tl.exp2(s_byte.to(tl.float32) - 127.0)).to(tl.bfloat16)
        k_nope = tl.where(m_nope, k_nope, 0.0)
        p_rope = (p_rec + 448).to(tl.pointer_type(tl.bfloat16))
        k_rope = tl.load(p_rope[:, None] + o_r[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q_nope, tl.trans(k_nope)) + tl.dot(q_rope, tl.trans(k_rope))
        s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(b_m, tl.max(s, axis=1))
        alpha = tl.exp2(b_m - m_new)
        p = tl.exp2(s - m_new[:, None])
        b_l = b_l * alpha + tl.sum(p, axis=1)
        pb = p.to(tl.bfloat16)
        acc_n = acc_n * alpha[:, None] + tl.dot(pb, k_nope)
        acc_r = acc_r * alpha[:, None] + tl.dot(pb, k_rope)
        b_m = m_new
    row = (i_t * num_heads + o_h) * MAX_SPLITS + i_s
    p_acc = part_acc_ptr + row.to(tl.int64)[:, None] * 512
    tl.store(p_acc + o_n[None, :], acc_n, mask=m_h[:, None] & (o_n < 448)[None, :])
    tl.store(p_acc + 448 + o_r[None, :], acc_r, mask=m_h[:, None])
    tl.store(part_ml_ptr + row * 2, b_m, mask=m_h)
    tl.store(part_ml_ptr + row * 2 + 1, b_l, mask=m_h)


@triton.jit
def _baseline_reduce_kernel(
    out_ptr,
    out_stride_t,
    out_stride_h,
    part_acc_ptr,
    part_ml_ptr,
    sink_ptr,
    num_heads,
    MAX_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    o_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < num_heads
    o_d = tl.arange(0, 512)
    b_m = tl.load(sink_ptr + o_h, mask=m_h, other=0.0) * 1.4426950408889634
    b_l = tl.full((BLOCK_H,), 1.0, tl.float32)  # the sink's own exp2(sink - m) = 1
    acc = tl.zeros((BLOCK_H, 512), tl.float32)
    for s in range(0, MAX_SPLITS):
        row = (i_t * num_heads + o_h) * MAX_SPLITS + s
        s_m = tl.load(part_ml_ptr + row * 2, mask=m_h, other=-1.0e30)
        s_l = tl.load(part_ml_ptr + row * 2 + 1, mask=m_h, other=0.0)
        s_acc = tl.load(
            part_acc_ptr + row.to(tl.int64)[:, None] * 512 + o_d[None, :],
            mask=m_h[:, None],
            other=0.0,
        )
        m_new = tl.maximum(b_m, s_m)
        a, b = tl.exp2(b_m - m_new), tl.exp2(s_m - m_new)
        b_l = b_l * a + s_l * b
        acc = acc * a[:, None] + s_acc * b[:, None]
        b_m = m_new
    out = acc / b_l[:, None]
    tl.store(
        out_ptr + i_t * out_stride_t + o_h[:, None] * out_stride_h + o_d[None, :],
        out.to(tl.bfloat16),
        mask=m_h[:, None],
    )


def baseline_sparse_mla_decode(
    q,
    cache,
    idx,
    lens,
    scale,
    sink,
    extra,
    extra_idx,
    extra_lens,
    out,
    num_heads,
    rows_per_split=256,
    block_h=16,
    block_n=16,
):
    """Same contract as ``sparse_mla_decode`` for the benchmark (sink required)."""
    T = q.shape[0]
    width = idx.shape[1] + (extra_idx.shape[1] if extra is not None else 0)
    splits = triton.cdiv(width, rows_per_split)
    part_acc = torch.empty((T, num_heads, splits, 512), dtype=torch.float32, device=q.device)
    part_ml = torch.zeros((T, num_heads, splits, 2), dtype=torch.float32, device=q.device)
    part_ml[..., 0] = -1.0e30
    has_extra = extra is not None
    _baseline_decode_kernel[(T, triton.cdiv(num_heads, block_h), splits)](
        q, q.stride(0), q.stride(1), part_acc, part_ml,
        cache, cache.stride(0), idx, idx.stride(0), lens,
        extra if has_extra else cache, extra.stride(0) if has_extra else 0,
        extra_idx if has_extra else idx, extra_idx.stride(0) if has_extra else 0,
        extra_lens if has_extra else lens,
        scale * 1.4426950408889634, num_heads,
        MAIN_BS=cache.shape[1], EXTRA_BS=extra.shape[1] if has_extra else 1,
        HAS_EXTRA=has_extra, ROWS_PER_SPLIT=rows_per_split, MAX_SPLITS=splits,
        BLOCK_H=block_h, BLOCK_N=block_n, num_warps=8, num_stages=1,
    )  # fmt: skip
    _baseline_reduce_kernel[(T, triton.cdiv(num_heads, block_h))](
        out, out.stride(0), out.stride(1), part_acc, part_ml, sink, num_heads,
        MAX_SPLITS=splits, BLOCK_H=block_h, num_warps=4,
    )  # fmt: skip
    return out
