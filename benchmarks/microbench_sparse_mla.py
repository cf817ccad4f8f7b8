"""Sparse MLA decode and prefill on the 584-byte V4 records (suite ``sparse_mla``).

Decode baseline: the original's baseline algorithm (separate NoPE/RoPE dots, exp2 scale
decode, a reduction launch always; ``baselines/sparse_mla_original.py``). Targets: >= 50%
of the device copy bandwidth at T=256; >= 1.3x at T <= 16. Prefill baseline: a PyTorch
gather + bmm + softmax path; TFLOP/s against this device's dense bf16 matmul rate
measured in the same run. The KV records come from ``microbench_kv_cache.random_cache``.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.microbench_sparse_mla``
"""

import os
import sys

import torch

from benchmarks.baselines.sparse_mla_original import baseline_sparse_mla_decode
from benchmarks.microbench_kv_cache import random_cache
from benchmarks.runner import Case, Gate, Registry, close_check, main_for_suite, restored_env
from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES
from deepinfer_sm80.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill
from deepinfer_sm80.ops.sparse_mla.engine import (
    DECODE_SPLITS_ENV,
    decode_engine,
    prefill_engine,
)

SUITE = "sparse_mla"


SCALE = 512**-0.5


def decode_inputs(T: int, heads: int, main_width: int, extra_width: int) -> tuple:
    """A decode case's inputs on the GPU: ``(q, cache, idx, lens, sink, extra, eidx,
    elens, outs)``, q ``[T, 64, 512]`` (64 padded heads, of which ``heads`` are real),
    every token with all its rows, and two output buffers."""
    g = torch.Generator(device="cuda").manual_seed(T * 131 + heads)
    n_main = max(4096, 2 * main_width)
    n_extra = max(65536, 4 * extra_width)  # a long compressed history to pick from
    cache = random_cache(-(-n_main // 256) + 1, 256, seed=1)
    extra = random_cache(-(-n_extra // 64) + 1, 64, seed=2) if extra_width else None
    idx = torch.randint(0, n_main, (T, main_width), device="cuda", generator=g).int()
    lens = torch.full((T,), main_width, dtype=torch.int32, device="cuda")
    eidx = elens = None
    if extra_width:
        eidx = torch.randint(0, n_extra, (T, extra_width), device="cuda", generator=g).int()
        elens = torch.full((T,), extra_width, dtype=torch.int32, device="cuda")
    q = (torch.randn(T, 64, 512, device="cuda", generator=g) * 1.4).to(torch.bfloat16)
    sink = torch.randn(64, device="cuda", generator=g) + 4
    outs = [torch.empty_like(q), torch.empty_like(q)]
    return q, cache, idx, lens, sink, extra, eidx, elens, outs


def run_decode(st: tuple, heads: int, splits: str, out_slot: int = 0) -> tuple:
    """``sparse_mla_decode`` on ``decode_inputs``' tensors, with
    DEEPINFER_SPARSE_MLA_DECODE_SPLITS=``splits``, into ``outs[out_slot]``: ``(out, lse)``."""
    q, cache, idx, lens, sink, extra, eidx, elens, outs = st
    with restored_env(DECODE_SPLITS_ENV):
        os.environ[DECODE_SPLITS_ENV] = splits
        return sparse_mla_decode(
            q,
            cache,
            idx,
            lens,
            SCALE,
            sink,
            extra,
            eidx,
            elens,
            out=outs[out_slot],
            num_heads=heads,
        )


def _decode_case(
    registry: Registry,
    T: int,
    heads: int,
    main_width: int,
    extra_width: int,
    splits: str = "latency",
):
    """``splits``: DEEPINFER_SPARSE_MLA_DECODE_SPLITS for the candidate (the deployment's
    choice; ``throughput`` names the case with that suffix)."""
    name = f"mla_decode_T{T}_H{heads}_w{main_width}+{extra_width}"
    if splits != "latency":
        name += f"_{splits}"

    def setup():
        return decode_inputs(T, heads, main_width, extra_width)

    def candidate(st):
        return run_decode(st, heads, splits)[0][:, :heads]

    def baseline(st):
        q, cache, idx, lens, sink, extra, eidx, elens, outs = st
        baseline_sparse_mla_decode(
            q, cache, idx, lens, SCALE, sink, extra, eidx, elens, outs[1], heads
        )
        return outs[1][:, :heads]

    rows = main_width + extra_width
    registry.add(
        Case(
            suite=SUITE,
            name=name,
            params={
                "T": T,
                "heads": heads,
                "main_width": main_width,
                "extra_width": extra_width,
                "splits": splits,
            },
            setup=setup,
            baseline_name="original baseline algorithm (separate NoPE/RoPE dots, exp2, reduce)",
            baseline=baseline,
            candidate_name=(
                "deepinfer decode, "
                + decode_engine(torch.device("cuda"))
                + f" kernel (DEEPINFER_SPARSE_MLA_DECODE picks), {splits} splits"
            ),
            candidate=candidate,
            check=lambda st, b, c: close_check(b, c, rel_tol=1e-2),
            # Records read once per token, q read and out written per real head.
            bytes_moved=lambda st: T * (rows * RECORD_BYTES + heads * 512 * 2 * 2),
            flops=lambda st: T * heads * rows * 512 * 4,
            # Targets: >= 50% of copy bandwidth at T=256, >= 1.3x at T <= 16.
            gates=[Gate("bandwidth_fraction_min", 0.5)]
            if T == 256
            else [Gate("speedup_min", 1.3)]
            if T <= 16
            else [],
        )
    )


def prefill_torch(q, kv, idx, scale, sink):
    """PyTorch path: gather rows, bmm logits, softmax with the sink column, bmm."""
    valid = (idx >= 0) & (idx < kv.shape[0])
    rows = kv[torch.where(valid, idx, 0).long()]  # [T, W, 512]
    s = torch.bmm(q, rows.transpose(1, 2)).float() * scale  # [T, H, W]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    s = torch.cat([s, sink[None, :, None].expand(q.shape[0], -1, 1)], dim=2)
    p = torch.softmax(s, dim=2)[..., :-1].to(torch.bfloat16)
    return torch.bmm(p, rows)


def _prefill_case(registry: Registry, T: int, heads: int, context: int):
    W = 640

    def setup():
        g = torch.Generator(device="cuda").manual_seed(context + heads)
        kv = (torch.randn(context + 128, 512, device="cuda", generator=g) * 1.4).bfloat16()
        idx = torch.randint(0, context + 128, (T, W), device="cuda", generator=g).int()
        q = (torch.randn(T, heads, 512, device="cuda", generator=g) * 1.4).bfloat16()
        sink = torch.randn(heads, device="cuda", generator=g) + 4
        # vLLM passes per-token lengths (from combine_topk_swa_indices): every entry here.
        lens = torch.full((T,), W, dtype=torch.int32, device="cuda")
        return q, kv, idx, sink, torch.empty_like(q), lens

    def candidate(st):
        q, kv, idx, sink, out, lens = st
        sparse_mla_prefill(q, kv, idx, SCALE, sink, topk_length=lens, out=out)
        return out

    registry.add(
        Case(
            suite=SUITE,
            name=f"mla_prefill_T{T}_H{heads}_ctx{context // 1024}K",
            params={"T": T, "heads": heads, "context": context, "width": W},
            setup=setup,
            baseline_name="torch gather + bmm + softmax(sink) + bmm",
            baseline=lambda st: prefill_torch(st[0], st[1], st[2], SCALE, st[3]),
            candidate_name=(
                "deepinfer prefill, "
                + prefill_engine(torch.device("cuda"))
                + " kernel (DEEPINFER_SPARSE_MLA_PREFILL picks)"
            ),
            candidate=candidate,
            check=lambda st, b, c: close_check(b, c, rel_tol=1e-2),
            flops=lambda st: T * heads * W * 512 * 4,
        )
    )


def build_registry() -> Registry:
    registry = Registry()
    for heads in (64, 32, 8):  # TP 1, 2, 8
        for T in (1, 4, 16, 64, 256):
            _decode_case(registry, T, heads, 128, 512)
    for heads in (64, 32, 8):  # decode_splits: throughput, one split per token
        for T in (1, 4, 16, 64, 256):
            _decode_case(registry, T, heads, 128, 512, splits="throughput")
    for T in (5, 80):  # DSpark draft layers: widened SWA window, no compressed cache
        _decode_case(registry, T, 32, 192, 0)
    for context in (16384, 65536):
        _prefill_case(registry, 1024, 64, context)
        _prefill_case(registry, 1024, 16, context)
    return registry


if __name__ == "__main__":
    sys.exit(main_for_suite(SUITE, build_registry()))
