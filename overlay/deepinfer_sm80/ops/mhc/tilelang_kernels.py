"""TileLang kernels of the mHC boundary (post mixing + delayed pre), built for sm_80/sm_86.

Four kernels; ``variants.py`` names their compiled variants (``deepinfer_sm80.tilelang_build``
compiles and caches them), ``ops.py`` launches them.

* ``post_prenorm_small``: token counts below 16. CUDA cores. Grid (mix tiles, 8 slices,
  token groups); each CTA holds a group of up to 4 tokens, so its slice of the fp32
  weights is read once per group (vLLM's fused kernel re-reads the weights per token).
  Each thread owns 4 hidden positions of the slice and all hc streams there.
* ``post_prenorm_tc``: 16 tokens and up. Tensor Cores through ``T.gemm`` on fp32
  operands, which TileLang lowers to TF32 ``mma.sync`` with fp32 accumulation. The post
  mixing is computed while the GEMM's A tile is built, so the mixed residual never makes
  a second trip through global memory.

Both write: the mixed residual (bf16), the collapse of the next layer input with the
carried pre-mix (bf16, before its RMSNorm) and its sum of squares, the GEMM partials
(``mix_part[row, token, 24]``; 8 rows from the small kernel, 40 from the Tensor Core
one) and the sum of squares of the mixed residual (the prenorm RMS), one per partial row.

* ``mix_norm_epilogue``: adds the partial rows in row order, applies the RMS scale,
  sigmoid pre/post, softmax + Sinkhorn for comb, and RMS-normalizes the collapsed layer
  input in place. Grid (tokens, hidden / 1024): warp 0 of chunk 0 does the coefficients
  while the other warps normalize, so the Sinkhorn latency overlaps the norm.
* ``post_sqrsum``: post mixing alone plus the row's sum of squares (``mhc_post_with_sqrsum``),
  one CTA per token. Built with ``--fmad=false`` so every multiply and add rounds on its
  own, which a PyTorch reference reproduces bit for bit.

The element-wise work indexes threads explicitly; TileLang infers layouts only for the
GEMM's shared tiles, its accumulator and the Tensor Core kernel's stage copies.
"""

# No `from __future__ import annotations`: TileLang evaluates the tensor annotations,
# which close over the builders' shape variables.
import tilelang.language as T  # noqa: N812 -- TileLang's own convention

from deepinfer_sm80.ops.mhc.geometry import (  # noqa: F401 -- LAUNCH_CONFIGS re-exported
    LAUNCH_CONFIGS,
    N_SPLITS,
    SMALL_VEC,
    mix_size,
    slice_width,
)

# Hidden elements per CTA of the epilogue's normalization and threads that do it
# (8 bf16 = one 16-byte load each).
EPILOGUE_CHUNK = 1024
EPILOGUE_VEC = 8
POST_SQRSUM_THREADS = 256


def _f32(v):
    return T.cast(v, "float32")


def _bf16(v):
    return T.cast(v, "bfloat16")


def _sum4(a, b, c, d):
    """(a + b) + (c + d): two dependent adds instead of three on the Sinkhorn's chain."""
    return (a + b) + (c + d)


def _coefficient_loader(hc: int, rows: int, threads: int):
    """A macro that fills s_comb/s_post/s_pre for tokens row0..row0+rows-1.

    Every thread issues its loads unconditionally (token index clamped into the batch)
    before any branch, so all of them are in flight at once; a per-token guard in the
    loop would serialize one memory round trip per token. Rows past the batch get zeros;
    without a carried pre-mix (use_pre_mix_in == 0) the collapse selects stream 0.
    """
    n_coef = hc * hc + 2 * hc
    passes = (rows * n_coef + threads - 1) // threads

    @T.macro
    def load(comb, post, pre_in, s_comb, s_post, s_pre, cv, row0, m, tid, use_pre_mix_in):
        for p in T.unroll(passes):
            e = p * threads + tid
            rr = e // n_coef
            f = e % n_coef
            tok = T.min(row0 + rr, m - 1)
            fc = T.min(f, hc * hc - 1)
            fp = T.max(T.min(f - hc * hc, hc - 1), 0)
            fq = T.max(T.min(f - hc * hc - hc, hc - 1), 0)
            cv[p, 0] = comb[tok, fc // hc, fc % hc]
            cv[p, 1] = post[tok, fp]
            cv[p, 2] = pre_in[tok, fq]
        for p in T.unroll(passes):
            e = p * threads + tid
            rr = e // n_coef
            f = e % n_coef
            valid = row0 + rr < m
            if rr < rows:
                if f < hc * hc:
                    s_comb[rr, f // hc, f % hc] = T.if_then_else(valid, cv[p, 0], 0.0)
                elif f < hc * hc + hc:
                    s_post[rr, f - hc * hc] = T.if_then_else(valid, cv[p, 1], 0.0)
                else:
                    s_pre[rr, f - hc * hc - hc] = T.if_then_else(
                        use_pre_mix_in != 0,
                        T.if_then_else(valid, cv[p, 2], 0.0),
                        T.if_then_else(f - hc * hc - hc == 0, 1.0, 0.0),
                    )

    return load, passes


def post_prenorm_small(
    hidden: int,
    hc: int,
    token_group: int,
    tile_n: int,
    hoist_loads: bool,
):
    """Fused post mixing + split prenorm GEMM on CUDA cores.

    Grid (mix tiles, 8 slices, token groups): a CTA holds ``token_group`` tokens, so its
    slice of the weights is read once per group (vLLM's kernel: once per token) while
    enough CTAs stay in flight to hide latency.
    """
    mix = mix_size(hc)
    sw = slice_width(hidden)
    k_total = hc * hidden
    vec = SMALL_VEC
    threads = sw // vec
    num_warps = threads // 32
    n_tiles = mix // tile_n
    n_red = tile_n + 2  # GEMM columns, then the residual's and the collapse's sum of squares
    assert threads % 32 == 0 and mix % tile_n == 0
    assert token_group * n_red <= threads
    load_coefficients, passes = _coefficient_loader(hc, token_group, threads)
    # hoist_loads: the weights and the group's x and residual load before the
    # coefficients' barrier (behind it they are a second memory round trip); it costs
    # registers held across the barrier (geometry.LAUNCH_CONFIGS says where it pays).
    m = T.dynamic("num_tokens")

    @T.prim_func
    def kernel(
        comb: T.Tensor((m, hc, hc), "float32"),
        residual: T.Tensor((m, hc, hidden), "bfloat16"),
        post: T.Tensor((m, hc), "float32"),
        x: T.Tensor((m, hidden), "bfloat16"),
        pre_in: T.Tensor((m, hc), "float32"),
        fn: T.Tensor((mix, k_total), "float32"),
        residual_out: T.Tensor((m, hc, hidden), "bfloat16"),
        collapsed: T.Tensor((m, hidden), "bfloat16"),
        aux: T.Tensor((m, hidden), "bfloat16"),
        mix_part: T.Tensor((N_SPLITS, m, mix), "float32"),
        sq_part: T.Tensor((N_SPLITS, m), "float32"),
        ysq_part: T.Tensor((N_SPLITS, m), "float32"),
        use_pre_mix_in: T.int32,
        write_aux: T.int32,
    ):
        with T.Kernel(n_tiles, N_SPLITS, T.ceildiv(m, token_group), threads=threads) as (
            i_nt,
            i_s,
            i_g,
        ):
            tid = T.get_thread_binding()
            t0 = i_g * token_group
            lane = tid % 32
            warp = tid // 32

            s_post = T.alloc_shared((token_group, hc), "float32")
            s_pre = T.alloc_shared((token_group, hc), "float32")
            s_comb = T.alloc_shared((token_group, hc, hc), "float32")
            s_red = T.alloc_shared((num_warps, token_group, n_red), "float32")

            w = T.alloc_local((tile_n, hc, vec), "float32")
            acc = T.alloc_local((token_group, n_red), "float32")
            xv = T.alloc_local((vec,), "float32")
            rv = T.alloc_local((hc, vec), "float32")
            nr = T.alloc_local((hc, vec), "float32")
            yv = T.alloc_local((vec,), "float32")
            outb = T.alloc_local((vec,), "bfloat16")
            cv = T.alloc_local((passes, 3), "float32")
            xb = T.alloc_local((token_group, vec), "bfloat16")
            rb = T.alloc_local((token_group, hc, vec), "bfloat16")

            h0 = i_s * sw + tid * vec
            if hoist_loads:
                for n in T.unroll(tile_n):
                    for j in T.unroll(hc):
                        for v in T.vectorized(vec):
                            w[n, j, v] = fn[i_nt * tile_n + n, j * hidden + h0 + v]
                for t in T.unroll(token_group):
                    tc = T.min(t0 + t, m - 1)
                    for v in T.vectorized(vec):
                        xb[t, v] = x[tc, h0 + v]
                    for i in T.unroll(hc):
                        for v in T.vectorized(vec):
                            rb[t, i, v] = residual[tc, i, h0 + v]
            load_coefficients(
                comb, post, pre_in, s_comb, s_post, s_pre, cv, t0, m, tid, use_pre_mix_in
            )
            T.sync_threads()

            if not hoist_loads:
                for n in T.unroll(tile_n):
                    for j in T.unroll(hc):
                        for v in T.vectorized(vec):
                            w[n, j, v] = fn[i_nt * tile_n + n, j * hidden + h0 + v]
            for t in T.unroll(token_group):
                for k in T.unroll(n_red):
                    acc[t, k] = 0.0

            # Every token of the group is computed (past the batch: a copy of its last token,
            # never stored) so that no guard stands between a token's loads and the next
            # token's: all loads of the unrolled loop can be in flight together.
            for t in T.unroll(token_group):
                ta = t0 + t
                if hoist_loads:
                    for v in T.unroll(vec):
                        xv[v] = _f32(xb[t, v])
                    for i in T.unroll(hc):
                        for v in T.unroll(vec):
                            rv[i, v] = _f32(rb[t, i, v])
                else:
                    tc = T.min(ta, m - 1)
                    for v in T.vectorized(vec):
                        xv[v] = _f32(x[tc, h0 + v])
                    for i in T.unroll(hc):
                        for v in T.vectorized(vec):
                            rv[i, v] = _f32(residual[tc, i, h0 + v])
                # residual'[j] = post[j] * x + sum_i comb[i, j] * residual[i], rounded to
                # bf16 as the op materializes it; the GEMM reads the rounded values.
                for j in T.unroll(hc):
                    for v in T.unroll(vec):
                        nr[j, v] = s_post[t, j] * xv[v]
                        for i in T.unroll(hc):
                            nr[j, v] = nr[j, v] + s_comb[t, i, j] * rv[i, v]
                        outb[v] = _bf16(nr[j, v])
                        nr[j, v] = _f32(outb[v])
                        acc[t, tile_n] = acc[t, tile_n] + nr[j, v] * nr[j, v]
                    if i_nt == 0 and ta < m:
                        for v in T.vectorized(vec):
                            residual_out[ta, j, h0 + v] = outb[v]
                for n in T.unroll(tile_n):
                    for j in T.unroll(hc):
                        for v in T.unroll(vec):
                            acc[t, n] = acc[t, n] + w[n, j, v] * nr[j, v]
                for v in T.unroll(vec):
                    yv[v] = 0.0
                    for j in T.unroll(hc):
                        yv[v] = yv[v] + s_pre[t, j] * nr[j, v]
                    outb[v] = _bf16(yv[v])
                    yv[v] = _f32(outb[v])
                    acc[t, tile_n + 1] = acc[t, tile_n + 1] + yv[v] * yv[v]
                if i_nt == 0 and ta < m:
                    for v in T.vectorized(vec):
                        collapsed[ta, h0 + v] = outb[v]
                if write_aux != 0 and i_nt == 0 and ta < m:
                    for v in T.unroll(vec):
                        yv[v] = 0.0
                        for j in T.unroll(hc):
                            yv[v] = yv[v] + nr[j, v]
                        outb[v] = _bf16(yv[v] / hc)
                    for v in T.vectorized(vec):
                        aux[ta, h0 + v] = outb[v]

            # Fixed-order reduction: butterfly within each warp, then warps 0..n in order.
            for t in T.unroll(token_group):
                for k in T.unroll(n_red):
                    acc[t, k] = T.warp_reduce_sum(acc[t, k])
            if lane == 0:
                for t in T.unroll(token_group):
                    for k in T.unroll(n_red):
                        s_red[warp, t, k] = acc[t, k]
            T.sync_threads()
            if tid < token_group * n_red:
                t = tid // n_red
                k = tid % n_red
                if t0 + t < m:
                    total = T.alloc_var("float32", init=0.0)
                    for wi in T.unroll(num_warps):
                        total += s_red[wi, t, k]
                    if k < tile_n:
                        mix_part[i_s, t0 + t, i_nt * tile_n + k] = total
                    elif i_nt == 0:
                        if k == tile_n:
                            sq_part[i_s, t0 + t] = total
                        else:
                            ysq_part[i_s, t0 + t] = total

    return kernel


# The Tensor Core kernel fills its stage tiles with explicit vectors (16-byte residual and
# weight vectors, 4-byte x vectors). Where vector q, lane v lands is computed by these
# functions, which work on ints and on TileLang expressions alike: the kernel indexes with
# them and ``check_tile_fill`` enumerates them. TileLang's race check cannot see through
# the div/mod indexing and warns that a tile "is written by multiple threads"; the
# enumeration at build time proves each element is written exactly once.


def residual_tile_coords(q, v, hc: int, block_h: int):
    """(token row, hc stream, hidden offset): 8 bf16 per vector, streams then rows."""
    per_stream = block_h // 8
    return q // (hc * per_stream), (q % (hc * per_stream)) // per_stream, (q % per_stream) * 8 + v


def x_tile_coords(q, v, block_h: int):
    """(token row, hidden offset): 2 bf16 per vector."""
    return q // (block_h // 2), (q % (block_h // 2)) * 2 + v


def weight_tile_coords(q, v, mix: int, block_h: int):
    """(mix row, hc stream, hidden offset): 4 fp32 per vector, mix rows fastest within a
    stream. Rows ``mix`` and up of the 32-row tile stay unwritten: they feed only GEMM
    output columns ``mix`` and up, which the kernel never stores."""
    quads = block_h // 4
    return (q % (mix * quads)) // quads, q // (mix * quads), (q % quads) * 4 + v


def check_tile_fill(name: str, coords, args: tuple, vectors: int, lanes: int, shape: tuple):
    """Raise unless ``vectors`` x ``lanes`` writes through ``coords`` cover every element
    of ``shape`` exactly once."""
    seen = set()
    for q in range(vectors):
        for v in range(lanes):
            at = coords(q, v, *args)
            if not all(0 <= i < n for i, n in zip(at, shape, strict=True)):
                raise AssertionError(f"{name} fill: q={q} v={v} lands at {at}, outside {shape}")
            seen.add(at)
    total = 1
    for n in shape:
        total *= n
    if len(seen) != vectors * lanes or len(seen) != total:
        raise AssertionError(
            f"{name} fill: {vectors * lanes} writes cover {len(seen)} of {total} "
            "elements (a repeat or a gap)"
        )


def post_prenorm_tc(
    hidden: int,
    hc: int,
    block_m: int,
    block_h: int,
    num_stages: int,
    threads: int,
    sub_blocks: int,
):
    """Fused post mixing + split prenorm GEMM on Tensor Cores (TF32), block_m tokens/CTA.

    Each of the 8 slices is cut into ``sub_blocks`` blocks of ``640 / sub_blocks`` hidden
    positions (128 for 5), one CTA each, so 16 tokens already fill 40 CTAs; the block's
    partial sums land in row ``slice * sub_blocks + block`` of the partial buffers and the
    epilogue adds all rows in that order.
    """
    mix = mix_size(hc)
    n_pad = 32  # the B tile has 32 rows: 4 warps x 8 mix columns; rows 24..31 are never
    # loaded, and only output columns 24..31 (discarded) read them.
    sw = slice_width(hidden)
    bw = sw // sub_blocks
    n_part = N_SPLITS * sub_blocks
    k_total = hc * hidden
    block_k = hc * block_h
    n_iter = bw // block_h
    vec = block_m * block_h // threads  # hidden positions per thread per step
    groups_per_row = block_h // vec
    num_warps = threads // 32
    assert bw % block_h == 0 and block_m * block_h == threads * vec and n_pad == 8 * num_warps
    load_coefficients, passes = _coefficient_loader(hc, block_m, threads)
    res_vecs_per_row = hc * block_h // 8
    res_passes = block_m * res_vecs_per_row // threads
    x_passes = block_m * block_h // 2 // threads
    w_passes = hc * mix * block_h // 4 // threads
    assert res_passes * threads == block_m * res_vecs_per_row
    assert x_passes * threads * 2 == block_m * block_h
    assert w_passes * threads * 4 == hc * mix * block_h
    check_tile_fill(
        "res_s",
        residual_tile_coords,
        (hc, block_h),
        res_passes * threads,
        8,
        (block_m, hc, block_h),
    )
    check_tile_fill("x_s", x_tile_coords, (block_h,), x_passes * threads, 2, (block_m, block_h))
    check_tile_fill(
        "w_s", weight_tile_coords, (mix, block_h), w_passes * threads, 4, (mix, hc, block_h)
    )
    m = T.dynamic("num_tokens")

    @T.prim_func
    def kernel(
        comb: T.Tensor((m, hc, hc), "float32"),
        residual: T.Tensor((m, hc, hidden), "bfloat16"),
        post: T.Tensor((m, hc), "float32"),
        x: T.Tensor((m, hidden), "bfloat16"),
        pre_in: T.Tensor((m, hc), "float32"),
        fn: T.Tensor((mix, k_total), "float32"),
        residual_out: T.Tensor((m, hc, hidden), "bfloat16"),
        collapsed: T.Tensor((m, hidden), "bfloat16"),
        aux: T.Tensor((m, hidden), "bfloat16"),
        mix_part: T.Tensor((n_part, m, mix), "float32"),
        sq_part: T.Tensor((n_part, m), "float32"),
        ysq_part: T.Tensor((n_part, m), "float32"),
        use_pre_mix_in: T.int32,
        write_aux: T.int32,
    ):
        with T.Kernel(T.ceildiv(m, block_m), n_part, threads=threads) as (i_m, i_p):
            tid = T.get_thread_binding()
            m0 = i_m * block_m
            # This thread's token row and hidden offset inside each step: fixed for the
            # whole loop, so its sums of squares belong to one row.
            r = tid // groups_per_row
            hq = (tid % groups_per_row) * vec
            tok = m0 + r

            s_post = T.alloc_shared((block_m, hc), "float32")
            s_pre = T.alloc_shared((block_m, hc), "float32")
            s_comb = T.alloc_shared((block_m, hc, hc), "float32")
            s_sq = T.alloc_shared((block_m, groups_per_row, 2), "float32")
            # (token, stream * block_h + h): TileLang infers no layout for a 3-D copy here.
            res_s = T.alloc_shared((block_m, block_k), "bfloat16")
            x_s = T.alloc_shared((block_m, block_h), "bfloat16")
            w_s = T.alloc_shared((n_pad, block_k), "float32")
            a_s = T.alloc_shared((block_m, block_k), "float32")
            c = T.alloc_fragment((block_m, n_pad), "float32")

            sq = T.alloc_local((2,), "float32")
            xv = T.alloc_local((vec,), "float32")
            rv = T.alloc_local((hc, vec), "float32")
            nr = T.alloc_local((hc, vec), "float32")
            yv = T.alloc_local((vec,), "float32")
            outb = T.alloc_local((vec,), "bfloat16")
            cv = T.alloc_local((passes, 3), "float32")

            load_coefficients(
                comb, post, pre_in, s_comb, s_post, s_pre, cv, m0, m, tid, use_pre_mix_in
            )
            sq[0] = 0.0
            sq[1] = 0.0
            T.clear(c)
            T.sync_threads()

            h_start = (i_p // sub_blocks) * sw + (i_p % sub_blocks) * bw
            for kb in T.Pipelined(n_iter, num_stages=num_stages):
                h_base = h_start + kb * block_h
                # Explicit 16-byte (residual, weights) and 4-byte (x) vectors, each thread
                # the same count, rows clamped into the batch: TileLang turns these into
                # cp.async stages. (T.copy picked 4-byte copies for these tiles: 4x the
                # load instructions, which bounded the kernel at large T.)
                for q, v in T.Parallel(res_passes * threads, 8):
                    row, stream, h = residual_tile_coords(q, v, hc, block_h)
                    res_s[row, stream * block_h + h] = residual[
                        T.min(m0 + row, m - 1), stream, h_base + h
                    ]
                for q, v in T.Parallel(x_passes * threads, 2):
                    row, h = x_tile_coords(q, v, block_h)
                    x_s[row, h] = x[T.min(m0 + row, m - 1), h_base + h]
                for q, v in T.Parallel(w_passes * threads, 4):
                    row, stream, h = weight_tile_coords(q, v, mix, block_h)
                    w_s[row, stream * block_h + h] = fn[row, stream * hidden + h_base + h]
                for v in T.unroll(vec):
                    xv[v] = _f32(x_s[r, hq + v])
                for i in T.unroll(hc):
                    for v in T.unroll(vec):
                        rv[i, v] = _f32(res_s[r, i * block_h + hq + v])
                for j in T.unroll(hc):
                    for v in T.unroll(vec):
                        nr[j, v] = s_post[r, j] * xv[v]
                        for i in T.unroll(hc):
                            nr[j, v] = nr[j, v] + s_comb[r, i, j] * rv[i, v]
                        outb[v] = _bf16(nr[j, v])
                        nr[j, v] = _f32(outb[v])
                        a_s[r, j * block_h + hq + v] = nr[j, v]
                        sq[0] = sq[0] + nr[j, v] * nr[j, v]
                    if tok < m:
                        for v in T.vectorized(vec):
                            residual_out[tok, j, h_base + hq + v] = outb[v]
                for v in T.unroll(vec):
                    yv[v] = 0.0
                    for j in T.unroll(hc):
                        yv[v] = yv[v] + s_pre[r, j] * nr[j, v]
                    outb[v] = _bf16(yv[v])
                    yv[v] = _f32(outb[v])
                    sq[1] = sq[1] + yv[v] * yv[v]
                if tok < m:
                    for v in T.vectorized(vec):
                        collapsed[tok, h_base + hq + v] = outb[v]
                if write_aux != 0:
                    for v in T.unroll(vec):
                        yv[v] = 0.0
                        for j in T.unroll(hc):
                            yv[v] = yv[v] + nr[j, v]
                        outb[v] = _bf16(yv[v] / hc)
                    if tok < m:
                        for v in T.vectorized(vec):
                            aux[tok, h_base + hq + v] = outb[v]
                T.gemm(a_s, w_s, c, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)

            for rr, n in T.Parallel(block_m, n_pad):
                if n < mix and m0 + rr < m:
                    mix_part[i_p, m0 + rr, n] = c[rr, n]
            # Sums of squares: this thread's steps, then a row's thread groups in order.
            s_sq[r, tid % groups_per_row, 0] = sq[0]
            s_sq[r, tid % groups_per_row, 1] = sq[1]
            T.sync_threads()
            if tid < block_m * 2:
                rr = tid // 2
                which = tid % 2
                if m0 + rr < m:
                    total = T.alloc_var("float32", init=0.0)
                    for g in T.unroll(groups_per_row):
                        total += s_sq[rr, g, which]
                    if which == 0:
                        sq_part[i_p, m0 + rr] = total
                    else:
                        ysq_part[i_p, m0 + rr] = total

    return kernel


def mix_norm_epilogue(
    hidden: int,
    hc: int,
    n_part: int,
    rms_numel: int,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    norm_eps: float,
):
    """Reduce the GEMM partials, make pre/post/comb, RMS-normalize the layer input."""
    mix = mix_size(hc)
    n_chunks = hidden // EPILOGUE_CHUNK
    norm_threads = EPILOGUE_CHUNK // EPILOGUE_VEC
    threads = 32 + norm_threads
    assert mix + 1 <= 32 and hc == 4  # _sum4 and the lane per mix assume hc = 4
    m = T.dynamic("num_tokens")

    @T.prim_func
    def kernel(
        mix_part: T.Tensor((n_part, m, mix), "float32"),
        sq_part: T.Tensor((n_part, m), "float32"),
        ysq_part: T.Tensor((n_part, m), "float32"),
        hc_scale: T.Tensor((3,), "float32"),
        hc_base: T.Tensor((mix,), "float32"),
        norm_weight: T.Tensor((hidden,), "bfloat16"),
        layer_input: T.Tensor((m, hidden), "bfloat16"),
        post_mix: T.Tensor((m, hc), "float32"),
        comb_mix: T.Tensor((m, hc * hc), "float32"),
        pre_mix_out: T.Tensor((m, hc), "float32"),
        has_norm: T.int32,
    ):
        with T.Kernel(m, n_chunks, threads=threads) as (i_t, i_c):
            tid = T.get_thread_binding()
            s_mix = T.alloc_shared((32,), "float32")
            s_logit = T.alloc_shared((hc * hc,), "float32")
            cm = T.alloc_local((hc, hc), "float32")
            inv = T.alloc_local((hc,), "float32")
            yv = T.alloc_local((EPILOGUE_VEC,), "float32")
            wv = T.alloc_local((EPILOGUE_VEC,), "float32")
            outb = T.alloc_local((EPILOGUE_VEC,), "bfloat16")
            if tid < 32:
                if i_c == 0:
                    # Lane j < mix owns mix j. Its base and scale are loaded first, with no
                    # branch before them, so they are in flight together with the partials
                    # (behind the warp barrier below they would cost a second round trip).
                    jl = T.min(tid, mix - 1)
                    base = T.alloc_var("float32")
                    base = hc_base[jl]
                    coef_scale = T.alloc_var("float32")
                    coef_scale = hc_scale[T.min(jl // hc, 2)]
                    # Unrolled with no branch inside: all partial loads are in flight at once,
                    # and the sum still runs in partial order 0..n_part-1.
                    total = T.alloc_var("float32", init=0.0)
                    if tid < mix:
                        for s in T.unroll(n_part):
                            total += mix_part[s, i_t, tid]
                        s_mix[tid] = total
                    elif tid == mix:
                        for s in T.unroll(n_part):
                            total += sq_part[s, i_t]
                        s_mix[tid] = total
                    T.sync_warp()
                    # Every lane makes its own mix's logit: pre and post lanes finish with
                    # their sigmoid and store; comb lanes hand theirs to lane 0.
                    rs = T.alloc_var("float32")
                    rs = T.rsqrt(s_mix[mix] / rms_numel + rms_eps)
                    logit = T.alloc_var("float32")
                    logit = s_mix[jl] * rs * coef_scale + base
                    if tid < hc:
                        pre_mix_out[i_t, tid] = T.sigmoid(logit) + hc_pre_eps
                    elif tid < 2 * hc:
                        post_mix[i_t, tid - hc] = T.sigmoid(logit) * hc_post_mult_value
                    elif tid < mix:
                        s_logit[tid - 2 * hc] = logit
                    T.sync_warp()
                    if tid == 0:
                        for j in T.unroll(hc):
                            for k in T.unroll(hc):
                                cm[j, k] = s_logit[j * hc + k]
                        # softmax over each row, + eps
                        for j in T.unroll(hc):
                            inv[j] = cm[j, 0]
                            for k in T.unroll(hc - 1):
                                inv[j] = T.max(inv[j], cm[j, k + 1])
                            for k in T.unroll(hc):
                                cm[j, k] = T.exp(cm[j, k] - inv[j])
                            inv[j] = T.fast_rcp(_sum4(cm[j, 0], cm[j, 1], cm[j, 2], cm[j, 3]))
                            for k in T.unroll(hc):
                                cm[j, k] = cm[j, k] * inv[j] + hc_sinkhorn_eps
                        # then columns, then (rows, columns) x (repeat - 1). Each divisor is
                        # inverted once with the hardware reciprocal (MUFU.RCP, ~1 ulp) and
                        # multiplied in, and each sum of 4 is a depth-2 tree: the 40
                        # dependent steps are the epilogue's critical path.
                        # A NaN row (CUDA-graph padding) skips the loop.
                        for k in T.unroll(hc):
                            inv[k] = T.fast_rcp(
                                _sum4(cm[0, k], cm[1, k], cm[2, k], cm[3, k]) + hc_sinkhorn_eps
                            )
                        for j in T.unroll(hc):
                            for k in T.unroll(hc):
                                cm[j, k] = cm[j, k] * inv[k]
                        if rs >= 0.0:
                            for _ in T.unroll(sinkhorn_repeat - 1):
                                for j in T.unroll(hc):
                                    inv[j] = T.fast_rcp(
                                        _sum4(cm[j, 0], cm[j, 1], cm[j, 2], cm[j, 3])
                                        + hc_sinkhorn_eps
                                    )
                                for j in T.unroll(hc):
                                    for k in T.unroll(hc):
                                        cm[j, k] = cm[j, k] * inv[j]
                                for k in T.unroll(hc):
                                    inv[k] = T.fast_rcp(
                                        _sum4(cm[0, k], cm[1, k], cm[2, k], cm[3, k])
                                        + hc_sinkhorn_eps
                                    )
                                for j in T.unroll(hc):
                                    for k in T.unroll(hc):
                                        cm[j, k] = cm[j, k] * inv[k]
                        for j in T.unroll(hc):
                            for k in T.unroll(hc):
                                comb_mix[i_t, j * hc + k] = cm[j, k]
            else:
                if has_norm != 0:
                    ysum = T.alloc_var("float32", init=0.0)
                    for s in T.unroll(n_part):
                        ysum += ysq_part[s, i_t]
                    scale = T.alloc_var("float32")
                    scale = T.rsqrt(ysum / hidden + norm_eps)
                    e0 = i_c * EPILOGUE_CHUNK + (tid - 32) * EPILOGUE_VEC
                    for v in T.vectorized(EPILOGUE_VEC):
                        yv[v] = _f32(layer_input[i_t, e0 + v])
                    for v in T.vectorized(EPILOGUE_VEC):
                        wv[v] = _f32(norm_weight[e0 + v])
                    for v in T.unroll(EPILOGUE_VEC):
                        outb[v] = _bf16(yv[v] * scale * wv[v])
                    for v in T.vectorized(EPILOGUE_VEC):
                        layer_input[i_t, e0 + v] = outb[v]

    return kernel


def post_sqrsum(hidden: int, hc: int):
    """residual' = post * x + sum_i comb[i, :] * residual[i] in a fixed fp32 order, + row sum x^2.

    Each output element is ``((((post[j] * x) + comb[0, j] * r0) + comb[1, j] * r1) +
    comb[2, j] * r2) + comb[3, j] * r3``, every product and sum rounded to fp32 on its
    own (the kernel is compiled with ``--fmad=false``), then rounded to bf16. The sum of
    squares is over the bf16 outputs of the whole ``hc * hidden`` row.
    """
    threads = POST_SQRSUM_THREADS
    quads = hidden // 4
    per_thread = quads // threads
    num_warps = threads // 32
    assert quads % threads == 0
    m = T.dynamic("num_tokens")

    @T.prim_func
    def kernel(
        comb: T.Tensor((m, hc, hc), "float32"),
        residual: T.Tensor((m, hc, hidden), "bfloat16"),
        post: T.Tensor((m, hc), "float32"),
        x: T.Tensor((m, hidden), "bfloat16"),
        residual_out: T.Tensor((m, hc, hidden), "bfloat16"),
        sqrsum: T.Tensor((m,), "float32"),
        write_sqrsum: T.int32,
    ):
        with T.Kernel(m, threads=threads) as i_t:
            tid = T.get_thread_binding()
            s_red = T.alloc_shared((num_warps,), "float32")
            cm = T.alloc_local((hc, hc), "float32")
            pm = T.alloc_local((hc,), "float32")
            xv = T.alloc_local((4,), "float32")
            rv = T.alloc_local((hc, 4), "float32")
            nr = T.alloc_local((4,), "float32")
            outb = T.alloc_local((4,), "bfloat16")
            sq = T.alloc_var("float32", init=0.0)
            for i in T.unroll(hc):
                pm[i] = post[i_t, i]
                for j in T.unroll(hc):
                    cm[i, j] = comb[i_t, i, j]
            for p in T.unroll(per_thread):
                h0 = (p * threads + tid) * 4
                for v in T.vectorized(4):
                    xv[v] = _f32(x[i_t, h0 + v])
                for i in T.unroll(hc):
                    for v in T.vectorized(4):
                        rv[i, v] = _f32(residual[i_t, i, h0 + v])
                for j in T.unroll(hc):
                    for v in T.unroll(4):
                        nr[v] = pm[j] * xv[v]
                        for i in T.unroll(hc):
                            nr[v] = nr[v] + cm[i, j] * rv[i, v]
                        outb[v] = _bf16(nr[v])
                        nr[v] = _f32(outb[v])
                        sq = sq + nr[v] * nr[v]
                    for v in T.vectorized(4):
                        residual_out[i_t, j, h0 + v] = outb[v]
            if write_sqrsum != 0:
                sq = T.warp_reduce_sum(sq)
                if tid % 32 == 0:
                    s_red[tid // 32] = sq
                T.sync_threads()
                if tid == 0:
                    total = T.alloc_var("float32", init=0.0)
                    for wi in T.unroll(num_warps):
                        total += s_red[wi]
                    sqrsum[i_t] = total

    return kernel
