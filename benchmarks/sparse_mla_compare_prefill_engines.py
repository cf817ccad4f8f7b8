"""Sparse-MLA prefill: the TileLang kernel (``attention_sm80.cuh``'s wide kernel over bf16
rows) against the Triton kernel, in one process on one GPU, at every head count per rank
(TP 8, 4, 2, 1) and the sparse_mla suite's shape (1,024 tokens, 640 index entries).

Both engines run through ``sparse_mla_prefill`` with ``DEEPINFER_SPARSE_MLA_PREFILL`` set;
medians with a cold L2 (``runner.CudaTimer``). Correctness is the GPU tests' job
(``tests/ops/test_sparse_mla.py``); the largest difference between the two outputs is
printed alongside.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.sparse_mla_compare_prefill_engines``.
"""

from __future__ import annotations

import argparse
import os

HEADS = (8, 16, 32, 64)
TOKENS, WIDTH, ROWS = 1024, 640, 16384 + 128
SCALE = 512**-0.5


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    import torch

    from benchmarks.runner import CudaTimer, device_info, restored_env
    from deepinfer_sm80.ops.sparse_mla import sparse_mla_prefill
    from deepinfer_sm80.ops.sparse_mla.engine import PREFILL_ENGINE_ENV

    if not torch.cuda.is_available():
        raise SystemExit("sparse_mla_compare_prefill_engines: needs a CUDA GPU")
    info = device_info()
    print(
        f"{info['gpu']} | torch {info['torch']} | triton {info['triton']} | "
        f"tilelang {info['tilelang']} | cold L2, median us; T={TOKENS}, {WIDTH} entries, "
        f"{ROWS} workspace rows"
    )
    timer = CudaTimer(reps=30)
    g = torch.Generator(device="cuda").manual_seed(5)
    kv = (torch.randn(ROWS, 512, device="cuda", generator=g) * 1.4).bfloat16()
    idx = torch.randint(0, ROWS, (TOKENS, WIDTH), device="cuda", generator=g).int()
    with restored_env(PREFILL_ENGINE_ENV):
        for heads in HEADS:
            q = (torch.randn(TOKENS, heads, 512, device="cuda", generator=g) * 1.4).bfloat16()
            sink = torch.randn(heads, device="cuda", generator=g) + 4
            us, outs = {}, {}
            for engine in ("triton", "tilelang"):
                os.environ[PREFILL_ENGINE_ENV] = engine

                def run(q=q, sink=sink):
                    return sparse_mla_prefill(q, kv, idx, SCALE, sink)[0]

                outs[engine] = run().float()
                us[engine] = timer(run).median_us
            flops = TOKENS * heads * WIDTH * 512 * 4
            rates = "  ".join(
                f"{e} {us[e]:7.1f} us ({flops / us[e] / 1e6:5.1f} TFLOP/s)" for e in us
            )
            diff = (outs["triton"] - outs["tilelang"]).abs().max().item()
            print(
                f"H={heads}: {rates}  {us['triton'] / us['tilelang']:.2f}x  max|diff| {diff:.3g}",
                flush=True,
            )


if __name__ == "__main__":
    main()
