"""Jit building blocks shared by the sparse-MLA kernels: reading a token's selected rows
out of the paged 584-byte V4 records (or bf16 workspace rows), and the final softmax
normalization.

A token's rows are one virtual list -- the SWA cache's rows, then the compressed
("extra") cache's -- cut into tiles of ``BLOCK_N``. ``tile_slots`` resolves a tile's
slots, ``tile_load`` issues its loads (invalid rows never touch memory), and
``token_rows`` is the one place the split count comes from, so the attention and the
reduction kernels always agree on it. ``finish_heads`` is the one place the sink enters.
"""

import triton
import triton.language as tl

from deepinfer_sm80.ops.fp8.triton_fp8 import e4m3_ue8m0_to_bf16

LOG2E = 1.4426950408889634
NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity" keeps exp2(m_old - m_new) NaN-free


@triton.jit
def tile_slots(i_t, r0, r_end, rows, HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr):
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
def tile_load(
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
        p_rec, p_scale = row_pointers(main_ptr, main_stride, slot, MAIN_BLOCK_SIZE)
        if HAS_EXTRA:
            e_rec, e_scale = row_pointers(extra_ptr, extra_stride, slot, EXTRA_BLOCK_SIZE)
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
def decode_fp8_groups(b_data, b_scale, b_rope):
    """bf16 ``[BLOCK_N, 8, 64]``: groups 0-6 the e4m3 bytes times their group's UE8M0
    scale (group = the 64 columns sharing one scale), group 7 the RoPE values."""
    b_nope = e4m3_ue8m0_to_bf16(b_data, tl.broadcast_to(b_scale, b_data.shape))
    is_rope = (tl.arange(0, 8) == 7)[None, :, None]
    return tl.where(is_rope, tl.broadcast_to(b_rope, b_data.shape), b_nope)


@triton.jit
def decode_fp8_tile(b_data, b_scale, b_rope, BLOCK_N: tl.constexpr):
    """One bf16 ``[BLOCK_N, 512]`` tile: columns 0-447 the e4m3 bytes times their
    64-column group's UE8M0 scale, 448-511 the RoPE values."""
    return tl.reshape(decode_fp8_groups(b_data, b_scale, b_rope), (BLOCK_N, 512))


@triton.jit
def row_pointers(cache_ptr, page_stride, slot, BLOCK_SIZE: tl.constexpr):
    page = (slot // BLOCK_SIZE).to(tl.int64)
    within = slot % BLOCK_SIZE
    p_page = cache_ptr + page * page_stride
    return p_page + within * 576, p_page + BLOCK_SIZE * 576 + within * 8


@triton.jit
def token_rows(
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


@triton.jit
def finish_heads(
    b_m,
    b_l,
    o_h,
    m_h,
    i_t,
    lse_ptr,
    lse_stride_t,
    maxl_ptr,
    sink_ptr,
    HAS_SINK: tl.constexpr,
    STORE_MAX: tl.constexpr,
):
    """Per head: store lse (and optionally the max logit), natural-log units, -inf for a
    head without rows; return the factor that normalizes its accumulator. The sink enters
    the denominator only. ``b_m`` is a base-2 running max, ``b_l`` the sum under it."""
    has_rows = b_l > 0.0
    if STORE_MAX:
        maxl = tl.where(has_rows, b_m / 1.4426950408889634, float("-inf"))
        tl.store(maxl_ptr + i_t * lse_stride_t + o_h, maxl, mask=m_h)
    lse = tl.where(
        has_rows, (b_m + tl.log2(tl.where(has_rows, b_l, 1.0))) / 1.4426950408889634, float("-inf")
    )
    tl.store(lse_ptr + i_t * lse_stride_t + o_h, lse, mask=m_h)
    if HAS_SINK:
        b_sink = tl.load(sink_ptr + o_h, mask=m_h, other=0.0) * 1.4426950408889634
        b_m_f = tl.maximum(b_m, b_sink)
        b_alpha = tl.exp2(b_m - b_m_f)
        b_den = b_l * b_alpha + tl.exp2(b_sink - b_m_f)
    else:
        b_alpha = tl.full(b_l.shape, 1.0, tl.float32)
        b_den = b_l
    b_den = tl.where(b_den > 0.0, b_den, 1.0)  # no rows, no sink: output 0
    return b_alpha / b_den
