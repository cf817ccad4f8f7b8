"""Sparse-MLA decode: the TileLang kernel (attention_sm80.cuh) against the Triton kernel, and
the TileLang kernel's split size, on every decode case of the sparse_mla suite.

Each call is captured in a CUDA graph and the replays are timed (``runner.CudaTimer``),
which is how vLLM runs decode: host overhead is left out, the GPU time stays. Both
kernels run in this one process on this one GPU; correctness is the sparse_mla suite's and
the GPU tests' job (``microbench_sparse_mla``, ``tests/ops/test_sparse_mla.py``).

Run: ``PYTHONPATH=overlay:. python -m benchmarks.sparse_mla_compare_decode_engines``; ``--variants``
takes other TileLang settings (``tilelang:ROWS_PER_SPLIT=128,PREFETCH=2``), ``--only`` a
substring of the case names.
"""

import argparse
import dataclasses
import os

import torch

from benchmarks.microbench_sparse_mla import build_registry
from benchmarks.runner import CudaTimer, device_info, restored_env
from deepinfer_sm80 import arch
from deepinfer_sm80.ops.sparse_mla.engine import DECODE_ENGINE_ENV

CONFIG = "sparse_mla.decode_tilelang"
DEFAULT_VARIANTS = (
    "triton",
    "tilelang:ROWS_PER_SPLIT=64",
    "tilelang:ROWS_PER_SPLIT=128",
    "tilelang:ROWS_PER_SPLIT=256",
)


def parse_variant(text: str) -> tuple[str, dict[str, int]]:
    """``engine[:NAME=int,...]`` -> (engine, overrides of the TileLang config's constexprs)."""
    engine, _, rest = text.partition(":")
    if engine not in ("triton", "tilelang"):
        raise ValueError(f"--variants: engine must be triton or tilelang, got {engine!r}")
    if engine == "triton" and rest:
        raise ValueError(f"--variants: {text!r}: settings apply to the TileLang kernel only")
    known = dict(arch.KERNEL_CONFIGS[CONFIG].constexpr_dict())
    overrides = {}
    for item in filter(None, rest.split(",")):
        name, eq, value = item.partition("=")
        if not eq or name not in known or not value.isdigit():
            raise ValueError(
                f"--variants: {item!r}: expected NAME=integer with NAME one of {sorted(known)}"
            )
        overrides[name] = int(value)
    return engine, overrides


def ampere_fit_notes(variants: list[tuple[str, str, dict[str, int]]]) -> list[str]:
    """A line per TileLang variant whose kernels (wide or narrow, at the widest decode
    index width) need more shared memory than a CTA may use on Ampere: the H200 runs
    them, but they are experiments, not configs that could ship."""
    from deepinfer_sm80.arch import STATIC_SMEM_LIMIT_BYTES
    from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import AttentionVariant

    base = arch.KERNEL_CONFIGS[CONFIG].constexpr_dict()
    notes = []
    for text, engine, overrides in variants:
        if engine != "tilelang":
            continue
        rows = {**base, **overrides}["ROWS_PER_SPLIT"]
        sizes = {
            kind: AttentionVariant(128, 512, True, True, rows, narrow=narrow).smem_bytes()
            for kind, narrow in (("wide", False), ("narrow", True))
        }
        over = {k: v for k, v in sizes.items() if v > STATIC_SMEM_LIMIT_BYTES}
        if over:
            listed = ", ".join(f"{k} {v} B" for k, v in over.items())
            notes.append(
                f"# {text}: shared memory {listed} > {STATIC_SMEM_LIMIT_BYTES} B per CTA "
                "(Ampere budget): runs here, cannot ship"
            )
    return notes


def decode_cases(only: str = "") -> list:
    """The sparse_mla suite's decode cases whose name contains ``only``, at the default split
    mode: the ``_throughput`` cases fix their split size (THROUGHPUT_ROWS_PER_SPLIT), so
    a ROWS_PER_SPLIT variant would run the same kernel under another label."""
    return [
        c
        for c in build_registry().cases()
        if c.name.startswith("mla_decode")
        and c.params.get("splits") == "latency"
        and only in c.name
    ]


def _graph_us(fn, timer: CudaTimer) -> float:
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.synchronize()
    return timer(graph.replay).median_us


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    parser.add_argument("--only", default="", help="substring of the case names to run")
    args = parser.parse_args(argv)
    variants = [(text, *parse_variant(text)) for text in args.variants]
    info = device_info()
    print(
        f"{info['gpu']} | torch {info['torch']} | triton {info['triton']} | "
        f"tilelang {info['tilelang']} | CUDA-graph replay, median us"
    )
    for note in ampere_fit_notes(variants):
        print(note)
    cases = decode_cases(args.only)
    timer = CudaTimer(reps=30)
    base = arch.KERNEL_CONFIGS[CONFIG]
    with restored_env(DECODE_ENGINE_ENV):
        try:
            for case in cases:
                state = case.setup()
                parts = []
                for text, engine, overrides in variants:
                    os.environ[DECODE_ENGINE_ENV] = engine
                    consts = {**base.constexpr_dict(), **overrides}
                    arch.KERNEL_CONFIGS[CONFIG] = dataclasses.replace(
                        base, constexprs=tuple(consts.items())
                    )
                    us = _graph_us(lambda case=case, state=state: case.candidate(state), timer)
                    parts.append(f"{text} {us:7.1f}")
                print(f"{case.name}: " + "  ".join(parts), flush=True)
                del state
        finally:
            arch.KERNEL_CONFIGS[CONFIG] = base


if __name__ == "__main__":
    main()
