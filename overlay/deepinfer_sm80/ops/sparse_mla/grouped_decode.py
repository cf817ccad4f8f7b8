"""Sparse MLA decode with the 512 dims split across warps (grouped): each V4 record is
decoded once per program for all of its ``BLOCK_H`` heads, and no warp touches another
warp's dims except for one sum of the QK partials.

Why: the unified kernel (``triton_kernel.py``) gives every warp the whole ``[BLOCK_N,
512]`` tile, so each of its two dots is one long dependent chain of MMAs, and the tile
crosses shared memory in two layouts with a barrier after each. Here the tile is kept as
``[8 groups, rows, 64]`` -- group ``g`` is the 64 dims that share UE8M0 scale ``g`` (group
7 is the bf16 RoPE part) -- and QK and PV are batched dots over the group axis. Triton
puts one warp on each batch entry of a batched dot (``num_warps`` = 8), so warp ``g``
decodes, multiplies and accumulates only group ``g``: QK is eight partial ``[BLOCK_H,
BLOCK_N]`` products summed across warps (a fixed-order reduction: deterministic), and
PV writes warp ``g``'s 64 output columns. Per thread that is ``BLOCK_H x 64`` of the
query and of the accumulator instead of ``BLOCK_H x 512 / 4 warps``, which is what
lets ``BLOCK_H`` grow to 32 (TP2's whole head count) within Ampere's registers.

Same maths, inputs, split policy and partials layout as ``sparse_mla_fwd_kernel``; the
reduction kernel is shared.
"""

import triton
import triton.language as tl

from deepinfer_sm80.ops._triton_utils import mma
from deepinfer_sm80.ops.fp8.triton_fp8 import e4m3_ue8m0_to_bf16
from deepinfer_sm80.ops.sparse_mla.kernel_parts import (
    NEG_BIG,
    finish_heads,
    row_pointers,
    tile_slots,
    token_rows,
)


@triton.jit
def _group_major_load(
    slot,
    is_main,
    valid,
    caches,
    MAIN_BLOCK_SIZE: tl.constexpr,
    EXTRA_BLOCK_SIZE: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
):
    """A tile's record bytes as ``[8 groups, rows, 64]`` e4m3 (group 7 is 0), scales
    ``[8, rows, 1]`` and RoPE ``[1, rows, 64]`` bf16: loaded straight into group-major
    order, so warp ``g``'s bytes land in warp ``g``."""
    main_ptr, main_stride, extra_ptr, extra_stride = caches
    p_rec, p_scale = row_pointers(main_ptr, main_stride, slot, MAIN_BLOCK_SIZE)
    if HAS_EXTRA:
        e_rec, e_scale = row_pointers(extra_ptr, extra_stride, slot, EXTRA_BLOCK_SIZE)
        p_rec = tl.where(is_main, p_rec, e_rec)
        p_scale = tl.where(is_main, p_scale, e_scale)
    p_rec = tl.multiple_of(p_rec, 16)[None, :, None]
    p_scale = p_scale[None, :, None]
    o_g = tl.arange(0, 8)[:, None, None]
    o_c = tl.arange(0, 64)[None, None, :]
    m_row = valid[None, :, None]
    b_data = tl.load(p_rec + o_g * 64 + o_c, mask=m_row & (o_g < 7), other=0)
    b_scale = tl.load(p_scale + o_g, mask=m_row, other=0)
    b_rope = tl.load((p_rec + 448).to(tl.pointer_type(tl.bfloat16)) + o_c, mask=m_row, other=0.0)
    return b_data, b_scale, b_rope


@triton.jit
def _decode_group_major(b_data, b_scale, b_rope):
    b_nope = e4m3_ue8m0_to_bf16(b_data, tl.broadcast_to(b_scale, b_data.shape))
    is_rope = (tl.arange(0, 8) == 7)[:, None, None]
    return tl.where(is_rope, tl.broadcast_to(b_rope, b_data.shape), b_nope)


@triton.jit(do_not_specialize=["num_tokens"])
def sparse_mla_decode_grouped_kernel(
    q_ptr,
    q_stride_t,
    q_stride_h,
    out_ptr,
    out_stride_t,
    out_stride_h,
    lse_ptr,
    lse_stride_t,
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
    HAS_EXTRA: tl.constexpr,
    HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr,
    ROWS_PER_SPLIT: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    i_s = tl.program_id(2)
    main_len, extra_len, n_splits = token_rows(
        i_t, main_len_ptr, extra_len_ptr, MAIN_WIDTH, EXTRA_WIDTH, HAS_LEN, HAS_EXTRA,
        ROWS_PER_SPLIT,
    )  # fmt: skip
    total = main_len + extra_len
    if i_s >= n_splits:
        return

    o_g = tl.arange(0, 8)[:, None, None]
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    o_h3 = o_h[None, :, None]
    o_c = tl.arange(0, 64)[None, None, :]
    m_h3 = o_h3 < num_heads
    b_q = tl.load(
        q_ptr + i_t * q_stride_t + o_h3 * q_stride_h + o_g * 64 + o_c, mask=m_h3, other=0.0
    )  # [8, BLOCK_H, 64] bf16

    b_m = tl.full((BLOCK_H,), NEG_BIG, tl.float32)
    b_l = tl.zeros((BLOCK_H,), tl.float32)
    b_acc = tl.zeros((8, BLOCK_H, 64), tl.float32)

    r_begin = i_s * ROWS_PER_SPLIT
    r_end = tl.minimum(r_begin + ROWS_PER_SPLIT, total)
    rows = (main_len, main_idx_ptr, main_idx_stride, main_rows, extra_idx_ptr,
            extra_idx_stride, extra_rows)  # fmt: skip
    caches = (main_ptr, main_stride, extra_ptr, extra_stride)
    for r0 in range(r_begin, r_end, BLOCK_N):
        slot, is_main, valid = tile_slots(i_t, r0, r_end, rows, HAS_EXTRA, BLOCK_N)
        b_data, b_scale, b_rope = _group_major_load(
            slot, is_main, valid, caches, MAIN_BLOCK_SIZE, EXTRA_BLOCK_SIZE, HAS_EXTRA
        )
        b_k = _decode_group_major(b_data, b_scale, b_rope)  # [8, BLOCK_N, 64] bf16
        b_s = tl.sum(mma(b_q, tl.permute(b_k, (0, 2, 1))), axis=0) * scale_log2
        b_s = tl.where(valid[None, :], b_s, float("-inf"))  # [BLOCK_H, BLOCK_N]
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_alpha = tl.exp2(b_m - b_m_new)
        b_p = tl.exp2(b_s - b_m_new[:, None])
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        b_p3 = tl.broadcast_to(b_p.to(tl.bfloat16)[None, :, :], (8, BLOCK_H, BLOCK_N))
        b_acc = b_acc * b_alpha[None, :, None] + mma(b_p3, b_k)
        b_m = b_m_new

    if n_splits == 1:
        factor = finish_heads(
            b_m, b_l, o_h, o_h < num_heads, i_t, lse_ptr, lse_stride_t, lse_ptr, sink_ptr,
            HAS_SINK, False,
        )  # fmt: skip
        tl.store(
            out_ptr + i_t * out_stride_t + o_h3 * out_stride_h + o_g * 64 + o_c,
            (b_acc * factor[None, :, None]).to(tl.bfloat16),
            mask=m_h3,
        )
    else:
        row = (i_t * num_heads + o_h) * MAX_SPLITS + i_s
        row3 = row.to(tl.int64)[None, :, None]
        tl.store(part_acc_ptr + row3 * 512 + o_g * 64 + o_c, b_acc, mask=m_h3)
        tl.store(part_ml_ptr + row * 2, b_m, mask=o_h < num_heads)
        tl.store(part_ml_ptr + row * 2 + 1, b_l, mask=o_h < num_heads)
