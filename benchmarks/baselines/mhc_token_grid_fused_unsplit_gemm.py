"""Baseline: stock vLLM 0.33.0's Ampere strategy for the mHC boundary, rebuilt in TileLang.

What vLLM runs on SM80 (``mhc_fused_post_pre_delayed_tilelang`` with DeepGEMM unsupported),
re-implemented here from its description so the benchmark times the *algorithm* on the
same TileLang and GPU as ours (vLLM itself is not installed on the GPU machine):

* up to 32 tokens: one "token-grid" fused kernel, grid (token, mix tile, 8 hidden slices),
  128 threads, each thread 5 hidden positions of a 640 slice; every CTA recomputes the
  post mixing of its (token, slice) and reads its mix rows of the fp32 weights, so the
  weights are read once *per token*. Mix tile: 2 rows below 16 tokens, 6 from 16 on.
* above 32 tokens: a post kernel (one CTA per token) writes the mixed residual, then an
  *unsplit* fp32 CUDA-core GEMM (one CTA per (token, 12 mix rows), 512 threads walking the
  whole 20,480-long row) produces the mixes and the sum of squares.
* then a per-token epilogue (one 96-thread CTA per token): warp 0 reduces the partials,
  makes pre/post and runs softmax + Sinkhorn with divisions; warps 1-2 collapse the four
  streams with the carried pre-mix into shared memory (bf16) and RMS-normalize it.

Numerics follow vLLM's: the fused path feeds the GEMM unrounded fp32 mixed values.
"""

import tilelang.language as T  # noqa: N812 -- TileLang's own convention
import torch

N_SPLITS = 8
FUSED_MAX_TOKENS = 32
FUSED_THREADS = 128


def token_grid_fused(hidden: int, hc: int, tile_n: int):
    mix = hc * (hc + 2)
    sw = hidden // N_SPLITS
    iters = sw // FUSED_THREADS
    num_warps = FUSED_THREADS // 32
    m = T.dynamic("num_tokens")

    @T.prim_func
    def kernel(
        comb: T.Tensor((m, hc, hc), "float32"),
        residual: T.Tensor((m, hc, hidden), "bfloat16"),
        post: T.Tensor((m, hc), "float32"),
        x: T.Tensor((m, hidden), "bfloat16"),
        fn: T.Tensor((mix, hc, hidden), "float32"),
        mix_part: T.Tensor((N_SPLITS, m, mix), "float32"),
        sq_part: T.Tensor((N_SPLITS, m), "float32"),
        residual_out: T.Tensor((m, hc, hidden), "bfloat16"),
    ):
        with T.Kernel(m, mix // tile_n, N_SPLITS, threads=FUSED_THREADS) as (t, i_nt, i_s):
            tid = T.get_thread_binding()
            s_red = T.alloc_shared((num_warps, tile_n + 1), "float32")
            acc = T.alloc_local((tile_n + 1,), "float32")
            pm = T.alloc_local((hc,), "float32")
            cm = T.alloc_local((hc, hc), "float32")
            nr = T.alloc_local((hc,), "float32")
            for k in T.unroll(tile_n + 1):
                acc[k] = 0.0
            for i in T.unroll(hc):
                pm[i] = post[t, i]
                for j in T.unroll(hc):
                    cm[i, j] = comb[t, i, j]
            for it in T.serial(iters):
                h = i_s * sw + it * FUSED_THREADS + tid
                for j in T.unroll(hc):
                    nr[j] = pm[j] * T.cast(x[t, h], "float32")
                    for i in T.unroll(hc):
                        nr[j] += cm[i, j] * T.cast(residual[t, i, h], "float32")
                if i_nt == 0:
                    for j in T.unroll(hc):
                        residual_out[t, j, h] = T.cast(nr[j], "bfloat16")
                        acc[tile_n] += nr[j] * nr[j]
                for n in T.unroll(tile_n):
                    for j in T.unroll(hc):
                        acc[n] += fn[i_nt * tile_n + n, j, h] * nr[j]
            for k in T.unroll(tile_n + 1):
                acc[k] = T.warp_reduce_sum(acc[k])
            if tid % 32 == 0:
                for k in T.unroll(tile_n + 1):
                    s_red[tid // 32, k] = acc[k]
            T.sync_threads()
            if tid < tile_n + 1:
                total = T.alloc_var("float32", init=0.0)
                for w in T.unroll(num_warps):
                    total += s_red[w, tid]
                if tid < tile_n:
                    mix_part[i_s, t, i_nt * tile_n + tid] = total
                elif i_nt == 0:
                    sq_part[i_s, t] = total

    return kernel


def post_only(hidden: int, hc: int):
    """vLLM's post kernel: one CTA of 128 threads per token, the hidden dimension in chunks
    of 1,024 (each thread 8 consecutive elements of every stream per chunk)."""
    threads, chunk, vec = 128, 1024, 8
    m = T.dynamic("num_tokens")

    @T.prim_func
    def kernel(
        comb: T.Tensor((m, hc, hc), "float32"),
        residual: T.Tensor((m, hc, hidden), "bfloat16"),
        post: T.Tensor((m, hc), "float32"),
        x: T.Tensor((m, hidden), "bfloat16"),
        residual_out: T.Tensor((m, hc, hidden), "bfloat16"),
    ):
        with T.Kernel(m, threads=threads) as t:
            tid = T.get_thread_binding()
            pm = T.alloc_local((hc,), "float32")
            cm = T.alloc_local((hc, hc), "float32")
            xv = T.alloc_local((vec,), "float32")
            rv = T.alloc_local((hc, vec), "float32")
            ob = T.alloc_local((vec,), "bfloat16")
            for i in T.unroll(hc):
                pm[i] = post[t, i]
                for j in T.unroll(hc):
                    cm[i, j] = comb[t, i, j]
            for ck in T.serial(hidden // chunk):
                h0 = ck * chunk + tid * vec
                for v in T.vectorized(vec):
                    xv[v] = T.cast(x[t, h0 + v], "float32")
                for i in T.unroll(hc):
                    for v in T.vectorized(vec):
                        rv[i, v] = T.cast(residual[t, i, h0 + v], "float32")
                for j in T.unroll(hc):
                    for v in T.unroll(vec):
                        ob[v] = T.cast(
                            pm[j] * xv[v]
                            + cm[0, j] * rv[0, v]
                            + cm[1, j] * rv[1, v]
                            + cm[2, j] * rv[2, v]
                            + cm[3, j] * rv[3, v],
                            "bfloat16",
                        )
                    for v in T.vectorized(vec):
                        residual_out[t, j, h0 + v] = ob[v]

    return kernel


def unsplit_gemm(hidden: int, hc: int, tile_n: int = 12, threads: int = 512):
    mix = hc * (hc + 2)
    k_total = hc * hidden
    num_warps = threads // 32
    m = T.dynamic("num_tokens")

    @T.prim_func
    def kernel(
        a: T.Tensor((m, k_total), "bfloat16"),
        fn: T.Tensor((mix, k_total), "float32"),
        mix_part: T.Tensor((1, m, mix), "float32"),
        sq_part: T.Tensor((1, m), "float32"),
    ):
        with T.Kernel(m, mix // tile_n, threads=threads) as (t, i_nt):
            tid = T.get_thread_binding()
            s_red = T.alloc_shared((num_warps, tile_n + 1), "float32")
            acc = T.alloc_local((tile_n + 1,), "float32")
            for k in T.unroll(tile_n + 1):
                acc[k] = 0.0
            for it in T.serial(k_total // threads):
                kk = it * threads + tid
                v = T.cast(a[t, kk], "float32")
                for n in T.unroll(tile_n):
                    acc[n] += v * fn[i_nt * tile_n + n, kk]
                acc[tile_n] += v * v
            for k in T.unroll(tile_n + 1):
                acc[k] = T.warp_reduce_sum(acc[k])
            if tid % 32 == 0:
                for k in T.unroll(tile_n + 1):
                    s_red[tid // 32, k] = acc[k]
            T.sync_threads()
            if tid < tile_n + 1:
                total = T.alloc_var("float32", init=0.0)
                for w in T.unroll(num_warps):
                    total += s_red[w, tid]
                if tid < tile_n:
                    mix_part[0, t, i_nt * tile_n + tid] = total
                elif i_nt == 0:
                    sq_part[0, t] = total

    return kernel


def per_token_epilogue(
    hidden: int,
    hc: int,
    n_part: int,
    rms_eps: float,
    pre_eps: float,
    sk_eps: float,
    post_mult: float,
    repeat: int,
    norm_eps: float,
):
    """vLLM's epilogue: one 96-thread CTA per token. Warp 0: partial sums, RMS, sigmoid
    pre/post, softmax + Sinkhorn (divisions). Threads 32..95: collapse the streams with
    the carried pre-mix chunk by chunk (1,024 wide) into shared memory as bf16 while
    summing squares, then RMS-normalize from shared memory."""
    mix = hc * (hc + 2)
    collapse_threads = 64
    chunk = 1024
    vec = 8
    groups = chunk // (collapse_threads * vec)  # 16-byte groups per thread per chunk
    m = T.dynamic("num_tokens")

    @T.prim_func
    def kernel(
        mix_part: T.Tensor((n_part, m, mix), "float32"),
        sq_part: T.Tensor((n_part, m), "float32"),
        hc_scale: T.Tensor((3,), "float32"),
        hc_base: T.Tensor((mix,), "float32"),
        residual: T.Tensor((m, hc, hidden), "bfloat16"),
        pre_in: T.Tensor((m, hc), "float32"),
        norm_weight: T.Tensor((hidden,), "bfloat16"),
        post_mix: T.Tensor((m, hc), "float32"),
        comb_mix: T.Tensor((m, hc * hc), "float32"),
        layer_input: T.Tensor((m, hidden), "bfloat16"),
        pre_out: T.Tensor((m, hc), "float32"),
    ):
        with T.Kernel(m, threads=32 + collapse_threads) as t:
            tid = T.get_thread_binding()
            s_mix = T.alloc_shared((32,), "float32")
            s_y = T.alloc_shared((hidden,), "bfloat16")
            s_sq = T.alloc_shared((2,), "float32")
            mx = T.alloc_local((mix,), "float32")
            cm = T.alloc_local((hc, hc), "float32")
            sm = T.alloc_local((hc,), "float32")
            pre = T.alloc_local((hc,), "float32")
            rv = T.alloc_local((groups, hc, vec), "float32")
            yb = T.alloc_local((vec,), "bfloat16")
            wv = T.alloc_local((vec,), "float32")
            if tid < 32:
                total = T.alloc_var("float32", init=0.0)
                if tid < mix:
                    for s in T.unroll(n_part):
                        total += mix_part[s, t, tid]
                    s_mix[tid] = total
                elif tid == mix:
                    for s in T.unroll(n_part):
                        total += sq_part[s, t]
                    s_mix[tid] = total
                T.sync_warp()
                if tid == 0:
                    rs = T.alloc_var("float32")
                    rs = T.rsqrt(s_mix[mix] / (hc * hidden) + rms_eps)
                    for j in T.unroll(mix):
                        mx[j] = s_mix[j] * rs
                    for j in T.unroll(hc):
                        pre_out[t, j] = T.sigmoid(mx[j] * hc_scale[0] + hc_base[j]) + pre_eps
                        post_mix[t, j] = (
                            T.sigmoid(mx[hc + j] * hc_scale[1] + hc_base[hc + j]) * post_mult
                        )
                    for j in T.unroll(hc):
                        for k in T.unroll(hc):
                            cm[j, k] = (
                                mx[2 * hc + j * hc + k] * hc_scale[2] + hc_base[2 * hc + j * hc + k]
                            )
                    for j in T.unroll(hc):
                        sm[j] = cm[j, 0]
                        for k in T.unroll(hc - 1):
                            sm[j] = T.max(sm[j], cm[j, k + 1])
                        for k in T.unroll(hc):
                            cm[j, k] = T.exp(cm[j, k] - sm[j])
                        sm[j] = 0.0
                        for k in T.unroll(hc):
                            sm[j] = sm[j] + cm[j, k]
                        for k in T.unroll(hc):
                            cm[j, k] = cm[j, k] / sm[j] + sk_eps
                    for k in T.unroll(hc):
                        sm[k] = 0.0
                        for j in T.unroll(hc):
                            sm[k] = sm[k] + cm[j, k]
                    for j in T.unroll(hc):
                        for k in T.unroll(hc):
                            cm[j, k] = cm[j, k] / (sm[k] + sk_eps)
                    for _ in T.serial(repeat - 1):
                        for j in T.unroll(hc):
                            sm[j] = 0.0
                            for k in T.unroll(hc):
                                sm[j] = sm[j] + cm[j, k]
                        for j in T.unroll(hc):
                            for k in T.unroll(hc):
                                cm[j, k] = cm[j, k] / (sm[j] + sk_eps)
                        for k in T.unroll(hc):
                            sm[k] = 0.0
                            for j in T.unroll(hc):
                                sm[k] = sm[k] + cm[j, k]
                        for j in T.unroll(hc):
                            for k in T.unroll(hc):
                                cm[j, k] = cm[j, k] / (sm[k] + sk_eps)
                    for j in T.unroll(hc):
                        for k in T.unroll(hc):
                            comb_mix[t, j * hc + k] = cm[j, k]
            else:
                c = tid - 32
                for j in T.unroll(hc):
                    pre[j] = pre_in[t, j]
                sq = T.alloc_var("float32", init=0.0)
                y = T.alloc_var("float32", init=0.0)
                for ck in T.serial(hidden // chunk):
                    for g in T.unroll(groups):
                        h0 = ck * chunk + (g * collapse_threads + c) * vec
                        for i in T.unroll(hc):
                            for v in T.vectorized(vec):
                                rv[g, i, v] = T.cast(residual[t, i, h0 + v], "float32")
                    for g in T.unroll(groups):
                        h0 = ck * chunk + (g * collapse_threads + c) * vec
                        for v in T.unroll(vec):
                            y = 0.0
                            for i in T.unroll(hc):
                                y += pre[i] * rv[g, i, v]
                            yb[v] = T.cast(y, "bfloat16")
                            sq += T.cast(yb[v], "float32") * T.cast(yb[v], "float32")
                        for v in T.vectorized(vec):
                            s_y[h0 + v] = yb[v]
                sq = T.warp_reduce_sum(sq)
                if c % 32 == 0:
                    s_sq[c // 32] = sq
            T.sync_threads()
            if tid >= 32:
                c = tid - 32
                scale = T.alloc_var("float32")
                scale = T.rsqrt((s_sq[0] + s_sq[1]) / hidden + norm_eps)
                for ck in T.serial(hidden // chunk):
                    for g in T.unroll(groups):
                        h0 = ck * chunk + (g * collapse_threads + c) * vec
                        for v in T.vectorized(vec):
                            wv[v] = T.cast(norm_weight[h0 + v], "float32")
                        for v in T.unroll(vec):
                            yb[v] = T.cast(
                                T.cast(s_y[h0 + v], "float32") * scale * wv[v], "bfloat16"
                            )
                        for v in T.vectorized(vec):
                            layer_input[t, h0 + v] = yb[v]

    return kernel


class TokenGridFusedUnsplitGemm:
    """vLLM 0.33.0's Ampere mHC boundary (with pre_mix and norm_weight, no aux)."""

    def __init__(self, hidden: int, hc: int, eps: dict, compile_fn):
        self.hidden, self.hc = hidden, hc
        self.fused = {n: compile_fn(token_grid_fused(hidden, hc, n)) for n in (2, 6)}
        self.post = compile_fn(post_only(hidden, hc))
        self.gemm = compile_fn(unsplit_gemm(hidden, hc))
        self.epilogue = {
            n: compile_fn(per_token_epilogue(hidden, hc, n, **eps)) for n in (N_SPLITS, 1)
        }

    def __call__(
        self, x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, pre_mix, norm_weight
    ):
        n, hc, hidden = residual.shape
        mix = hc * (hc + 2)
        dev = residual.device
        post_2d = post_layer_mix.view(n, hc)
        residual_cur = torch.empty_like(residual)
        if n <= FUSED_MAX_TOKENS:
            parts = N_SPLITS
            mix_part = torch.empty(parts, n, mix, dtype=torch.float32, device=dev)
            sq_part = torch.empty(parts, n, dtype=torch.float32, device=dev)
            self.fused[2 if n < 16 else 6](
                comb_res_mix,
                residual,
                post_2d,
                x,
                fn.view(mix, hc, hidden),
                mix_part,
                sq_part,
                residual_cur,
            )
        else:
            parts = 1
            mix_part = torch.empty(1, n, mix, dtype=torch.float32, device=dev)
            sq_part = torch.empty(1, n, dtype=torch.float32, device=dev)
            self.post(comb_res_mix, residual, post_2d, x, residual_cur)
            self.gemm(residual_cur.view(n, hc * hidden), fn, mix_part, sq_part)
        post = torch.empty(n, hc, dtype=torch.float32, device=dev)
        comb = torch.empty(n, hc * hc, dtype=torch.float32, device=dev)
        layer_input = torch.empty(n, hidden, dtype=torch.bfloat16, device=dev)
        next_pre = torch.empty(n, hc, dtype=torch.float32, device=dev)
        self.epilogue[parts](
            mix_part,
            sq_part,
            hc_scale,
            hc_base,
            residual_cur,
            pre_mix,
            norm_weight,
            post,
            comb,
            layer_input,
            next_pre,
        )
        return residual_cur, post.unsqueeze(-1), comb.view(n, hc, hc), layer_input, next_pre
