"""Sparse-MLA decode: the TileLang kernel (decode_sm80.cuh) against the Triton kernel, and
the TileLang kernel's split size, on every decode case of the kernels suite.

Each call is captured in a CUDA graph and the replays are timed (``runner.CudaTimer``),
which is how vLLM runs decode: host overhead is left out, the GPU time stays. Both
kernels run in this one process on this one GPU; correctness is the kernels suite's and
the GPU tests' job (``microbench_sm80_kernels``, ``tests/ops/test_sparse_mla.py``).

Run: ``PYTHONPATH=overlay:. python -m benchmarks.compare_decode_engines``
"""

import dataclasses
import os

import torch

from benchmarks.microbench_sm80_kernels import build_registry
from benchmarks.runner import CudaTimer, device_info
from deepinfer_sm80 import arch
from deepinfer_sm80.ops.sparse_mla.triton_kernel import DECODE_ENGINE_ENV

CONFIG = "sparse_mla.decode_tilelang"
# (engine, TileLang rows per split); None = the Triton kernel's own config.
VARIANTS = [("triton", None), ("tilelang", 64), ("tilelang", 128), ("tilelang", 256)]


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


def main() -> None:
    info = device_info()
    print(
        f"{info['gpu']} | torch {info['torch']} | triton {info['triton']} | "
        f"tilelang {info['tilelang']} | CUDA-graph replay, median us"
    )
    cases = [c for c in build_registry().cases() if c.name.startswith("mla_decode")]
    timer = CudaTimer(reps=30)
    base = arch.KERNEL_CONFIGS[CONFIG]
    previous = os.environ.get(DECODE_ENGINE_ENV)
    try:
        for case in cases:
            state = case.setup()
            parts = []
            for engine, rows in VARIANTS:
                os.environ[DECODE_ENGINE_ENV] = engine
                if rows is not None:
                    consts = {**base.constexpr_dict(), "ROWS_PER_SPLIT": rows}
                    arch.KERNEL_CONFIGS[CONFIG] = dataclasses.replace(
                        base, constexprs=tuple(consts.items())
                    )
                us = _graph_us(lambda case=case, state=state: case.candidate(state), timer)
                parts.append(f"{engine}{'' if rows is None else f' r{rows}'} {us:7.1f}")
            print(f"{case.name}: " + "  ".join(parts), flush=True)
            del state
    finally:
        arch.KERNEL_CONFIGS[CONFIG] = base
        if previous is None:
            os.environ.pop(DECODE_ENGINE_ENV, None)
        else:
            os.environ[DECODE_ENGINE_ENV] = previous


if __name__ == "__main__":
    main()
