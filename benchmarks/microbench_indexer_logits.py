"""Sparse-indexer scoring at DeepSeek-V4.1 shapes (suite ``indexer``).

Candidates: ``ops/indexer_logits`` (the replacements of DeepGEMM's
``fp8_fp4_mqa_logits`` and ``fp8_fp4_paged_mqa_logits``), called through their vLLM
signatures. Shapes: 32 index heads x 128 dims (V4.1-Flash; one 64-head case), index
keys per compressed position, ratio 1 (1,048,576-wide decode rows, 128-position pages)
and ratio 2 (524,288, 64-position pages), contexts up to the full 1M / ratio; prefill
chunks sized to vLLM's 512 MiB logits budget (M x N <= 128 Mi elements).

Baselines are the algorithms of vLLM's own PyTorch references (vLLM is not installed
on the GPU machine, so ``ops/indexer_logits/ref.py`` re-implements them):
- prefill: ``mqa_logits_torch_bf16_einsum``, the algorithm of ``fp8_mqa_logits_torch``
  (DeepGEMM's test): one bf16 einsum over heads and keys, scale, relu, weight, head sum,
  -inf mask; processed 16 rows at a time so the [H, rows, N] scores fit in memory;
- decode: ``paged_mqa_logits_torch_loop``, the algorithm of
  ``fp8_paged_mqa_logits_torch`` (next_n = 1): a loop over requests, page gather, fp32
  decode, ``F.linear``, relu, weight, head sum, scale. next_n = 2 cases give it one row
  per query (same logits, per-row lengths).

Checked before timing over every row's valid columns: relative Frobenius error <= 1e-2
vs the bf16 prefill baseline (it rounds each head's dot to bf16), <= 1e-4 vs the fp32
decode baseline; -inf exactly where the layout says. Reported: GB/s (index-cache bytes
read + logits written, against the copy bandwidth measured in the same run) and TFLOP/s
(2 x H x 128 per logit, against this device's dense bf16 matmul). The decode gate is a
target, unmeasured on an Ampere GPU.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.microbench_indexer_logits``
"""

import sys

import torch

from benchmarks.runner import Case, CheckResult, Gate, Registry, main_for_suite
from deepinfer_sm80.ops.indexer_logits import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits
from deepinfer_sm80.ops.indexer_logits.layout import HEAD_DIM, SCALE_BYTES, page_views
from deepinfer_sm80.ops.indexer_logits.ref import (
    mqa_logits_torch_bf16_einsum,
    paged_mqa_logits_torch_loop,
    quantize_index_k_ref,
)

SUITE = "indexer"
HEADS = 32  # DeepSeek-V4.1-Flash index_n_heads
MAX_MODEL_LEN = 1048576
# vLLM's indexer kernel block is 128 tokens off sm90, i.e. 128 / ratio positions a page.
PAGE_POSITIONS = {1: 128, 2: 64}
PAGE_PAD = 576  # V4.1 pages share a physical block; any padding exercises the stride


def _queries(rows: int, heads: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows * heads, HEAD_DIM, device="cuda", generator=g)
    values, _ = quantize_index_k_ref(x)
    return values.view(rows, heads, HEAD_DIM).view(torch.float8_e4m3fn)


def _keys(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, HEAD_DIM, device="cuda", generator=g)
    x *= torch.exp(torch.randn(n, 1, device="cuda", generator=g))  # per-key magnitudes
    return quantize_index_k_ref(x)


def _weights(rows: int, heads: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, heads, device="cuda", generator=g) * 0.05


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


# ------------------------------------------------------------------ prefill


def _prefill_case(registry: Registry, ctx: int, queries: int, ratio: int, heads: int = HEADS):
    name = f"prefill_ctx{ctx}_q{queries}_r{ratio}_h{heads}"
    num_keys = (ctx + queries) // ratio

    def setup():
        g = torch.Generator(device="cuda").manual_seed(ctx + queries)
        k_bytes, k_scale = _keys(num_keys, g)
        i = torch.arange(queries, device="cuda", dtype=torch.int32)
        ks = torch.zeros(queries, dtype=torch.int32, device="cuda")
        ke = ((ctx + 1 + i) // ratio).to(torch.int32)
        q = _queries(queries, heads, g)
        return q, k_bytes.view(torch.float8_e4m3fn), k_scale, _weights(queries, heads, g), ks, ke

    def candidate(st):
        q, k, k_scale, w, ks, ke = st
        return fp8_fp4_mqa_logits((q, None), (k, k_scale), w, ks, ke, num_keys)

    def baseline(st):
        q, k, k_scale, w, ks, ke = st
        return mqa_logits_torch_bf16_einsum(q, k, k_scale, w, ks, ke, row_chunk=16)

    def check(st, base, cand) -> CheckResult:
        _, _, _, _, ks, ke = st
        cols = torch.arange(num_keys, device="cuda")[None, :]
        lens = (ke - ks)[:, None]
        inside = cols < lens
        # Compressed layout: candidate column j is baseline column ks + j.
        idx = (ks[:, None] + cols).clamp(max=num_keys - 1).long()
        base_c = torch.gather(base, 1, idx)
        if not torch.isneginf(cand[~inside]).all():
            return CheckResult(False, "columns past a row's keys are not -inf")
        if not torch.isfinite(cand[inside]).all():
            return CheckResult(False, "non-finite logits inside a row's keys")
        rel = _rel_error(cand[inside], base_c[inside])
        return CheckResult(rel <= 1e-2, f"relative error {rel:.2e} vs bf16 baseline (tol 1e-2)")

    logits = sum(min((ctx + 1 + i) // ratio, num_keys) for i in range(queries))
    registry.add(
        Case(
            suite=SUITE,
            name=name,
            params={
                "context": ctx,
                "queries": queries,
                "ratio": ratio,
                "heads": heads,
                "keys": num_keys,
            },
            setup=setup,
            baseline_name="vLLM fp8_mqa_logits_torch algorithm (bf16 einsum, 16-row chunks)",
            baseline=baseline,
            candidate_name="deepinfer prefill logits (software e4m3 -> fp16 Tensor Cores)",
            candidate=candidate,
            check=check,
            bytes_moved=lambda st: num_keys * (HEAD_DIM + SCALE_BYTES) + queries * num_keys * 4,
            flops=lambda st: 2 * heads * HEAD_DIM * logits,
        )
    )


# ------------------------------------------------------------------ paged decode


def _paged_state(
    lens: list[int], ratio: int, heads: int, rows_per_req: int, next_n: int, seed: int
):
    """A paged cache with ``lens[b]`` positions per request, pages shuffled; queries
    ``[B * rows_per_req, next_n, H, D]``; block table rows repeated per query row when
    ``rows_per_req > 1`` (vLLM's flattened spec decode)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    bs = PAGE_POSITIONS[ratio]
    pages = [-(-n // bs) for n in lens]
    num_blocks = sum(pages) + 4
    stride = bs * (HEAD_DIM + SCALE_BYTES) + PAGE_PAD
    flat = torch.zeros(num_blocks * stride, dtype=torch.uint8, device="cuda")
    cache = flat.as_strided(
        (num_blocks, bs, HEAD_DIM + SCALE_BYTES), (stride, HEAD_DIM + SCALE_BYTES, 1)
    )
    values, scales = page_views(cache, bs)
    perm = torch.randperm(num_blocks, device="cuda", generator=g).int()
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32, device="cuda")
    first = 0
    for b, (n, p) in enumerate(zip(lens, pages, strict=True)):
        table[b, :p] = perm[first : first + p]
        first += p
        k_bytes, k_scale = _keys(n, g)
        pos = torch.arange(n, device="cuda")
        page = table[b, pos // bs].long()
        values[page, pos % bs] = k_bytes
        scales[page, pos % bs] = k_scale
    table = table.repeat_interleave(rows_per_req, dim=0)
    batch = len(lens) * rows_per_req
    q = _queries(batch * next_n, heads, g).view(batch, next_n, heads, HEAD_DIM)
    return cache, table, q, _weights(batch * next_n, heads, g)


def _decode_case(
    registry: Registry,
    name: str,
    lens: list[int],
    ratio: int,
    heads: int = HEADS,
    rows_per_req: int = 1,
    next_n: int = 1,
    gates: tuple[Gate, ...] = (),
):
    width = MAX_MODEL_LEN // ratio
    # Per query row: flattened rows of one request see len - rows_per_req + 1 + r keys.
    row_lens = [
        max(0, n - rows_per_req * next_n + 1 + r)
        for n in lens
        for r in range(rows_per_req * next_n)
    ]

    def setup():
        cache, table, q, w = _paged_state(lens, ratio, heads, rows_per_req, next_n, seed=sum(lens))
        per_row = torch.tensor(row_lens, dtype=torch.int32, device="cuda")
        ctx = per_row.view(-1, next_n)  # vLLM's (B, next_n) lengths
        # The baseline's loop bounds are host integers: its lengths live on the host from
        # the start, so its timed region holds GPU work only (no device-to-host copy).
        host_ctx = torch.tensor(row_lens, dtype=torch.int32)
        return cache, table, q, w, ctx, host_ctx

    def candidate(st):
        cache, table, q, w, ctx, _ = st
        return fp8_fp4_paged_mqa_logits((q, None), cache.unsqueeze(-2), w, ctx, table, None, width)

    def baseline(st):
        cache, table, q, w, _, host_ctx = st
        # One row per query: the same logits, each row with its own length.
        flat_q = q.reshape(-1, 1, heads, HEAD_DIM)
        flat_table = table.repeat_interleave(next_n, dim=0)
        return paged_mqa_logits_torch_loop(flat_q, cache, w, host_ctx, flat_table, width)

    def check(st, base, cand) -> CheckResult:
        lens_t = torch.tensor(row_lens, device="cuda")
        req_t = lens_t.view(-1, next_n).amax(1).repeat_interleave(next_n)
        cols = torch.arange(width, device="cuda")[None, :]
        inside = cols < lens_t[:, None]
        masked = (cols >= lens_t[:, None]) & (cols < req_t[:, None])
        if not torch.isneginf(cand[masked]).all():
            return CheckResult(
                False, "columns between a row's and its request's length are not -inf"
            )
        if not torch.isfinite(cand[inside]).all():
            return CheckResult(False, "non-finite logits inside a row's keys")
        rel = _rel_error(cand[inside], base[inside])
        return CheckResult(rel <= 1e-4, f"relative error {rel:.2e} vs fp32 baseline (tol 1e-4)")

    registry.add(
        Case(
            suite=SUITE,
            name=name,
            params={
                "lens": lens,
                "ratio": ratio,
                "heads": heads,
                "rows_per_request": rows_per_req,
                "next_n": next_n,
                "page_positions": PAGE_POSITIONS[ratio],
                "width": width,
            },
            setup=setup,
            baseline_name="vLLM fp8_paged_mqa_logits_torch algorithm (per-request loop, fp32)",
            baseline=baseline,
            candidate_name="deepinfer paged decode logits (software e4m3 -> fp16 Tensor Cores)",
            candidate=candidate,
            check=check,
            # Minimum traffic: each request's keys read once, every logit written once
            # (flattened rows of one request re-read its keys, mostly from L2).
            bytes_moved=lambda st: sum(lens) * (HEAD_DIM + SCALE_BYTES) + 4 * sum(row_lens),
            flops=lambda st: 2 * heads * HEAD_DIM * sum(row_lens),
            gates=list(gates),
        )
    )


def build_registry() -> Registry:
    registry = Registry()
    # Decode, one request, context sweep to the full 1M (ratio 1) and 512K (ratio 2).
    long_gate = (Gate("bandwidth_fraction_min", 0.4),)
    for ctx in (4096, 65536, 262144, 1048576):
        _decode_case(
            registry, f"decode_b1_ctx{ctx}_r1", [ctx], 1, gates=long_gate if ctx >= 262144 else ()
        )
    _decode_case(registry, "decode_b1_ctx524288_r2", [524288], 2, gates=long_gate)
    _decode_case(registry, "decode_b1_ctx262144_r1_h64", [262144], 1, heads=64)
    # Batched decode: 32 requests at 32K compressed positions (ratio 2).
    _decode_case(registry, "decode_b32_ctx32768_r2", [32768] * 32, 2)
    # DSpark K=5 on sm80: vLLM flattens 6 query rows per request (next_n 6 has no
    # native path below sm90): 16 requests x 6 rows sharing block tables.
    _decode_case(registry, "decode_dspark_16x6_ctx16384_r1", [16384] * 16, 1, rows_per_req=6)
    # Native next_n = 2 (MTP-style K=1), 16 requests.
    _decode_case(registry, "decode_b16_n2_ctx65536_r1", [65536] * 16, 1, next_n=2)
    # Prefill chunks within vLLM's 128 Mi-element logits budget.
    _prefill_case(registry, 16384, 512, 1)
    _prefill_case(registry, 16384, 512, 1, heads=64)
    _prefill_case(registry, 131072, 960, 1)
    _prefill_case(registry, 1048576 - 120, 120, 1)
    _prefill_case(registry, 32768, 2048, 2)
    return registry


if __name__ == "__main__":
    sys.exit(main_for_suite(SUITE, build_registry()))
