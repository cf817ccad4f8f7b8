"""The device's mma.sync rate: Ampere's Tensor Core instruction (m16n8k16, bf16 in, fp32
accumulate), which the sparse-MLA decode kernels use, at several occupancies and numbers
of independent MMA chains per warp, beside the dense bf16 matmul rate (``torch.matmul``,
cuBLAS with the device's own instructions) in the same process.

Why: the decode target (50% of copy bandwidth at T=256) implies a Tensor Core rate for
32 and 64 heads per rank; this says what fraction of the instruction's ceiling that is,
on the GPU at hand, at the occupancy the kernels run at (2 CTAs x 8 warps per SM). The
kernel moves no memory, so it is a ceiling, not a model of the decode.

Run on a CUDA GPU: ``PYTHONPATH=overlay:. python -m benchmarks.sparse_mla_mma_sync_peak``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SOURCE_FILE = Path(__file__).with_name("sparse_mla_mma_sync_peak.cuh")
STEPS = 4096  # MMAs per chain
MMA_FLOPS = 2 * 16 * 8 * 16  # one m16n8k16
# (threads per CTA, CTAs per SM): 16 warps per SM is the decode kernels' occupancy.
SHAPES = ((256, 1), (256, 2), (512, 2), (256, 4), (256, 8))
CHAINS = (1, 2, 4, 8)


def flops(sms: int, ctas_per_sm: int, threads: int, chains: int, steps: int = STEPS) -> int:
    """Floating-point operations of one launch: every warp runs chains x steps MMAs."""
    return sms * ctas_per_sm * (threads // 32) * chains * steps * MMA_FLOPS


def build(sms: int, ctas_per_sm: int, threads: int, chains: int, steps: int = STEPS):
    """The TileLang kernel: sms x ctas_per_sm CTAs, each calling mma_sync_peak::run."""
    import tilelang
    import tilelang.language as T  # noqa: N812 -- TileLang's own spelling

    from deepinfer_sm80 import tilelang_build

    source = SOURCE_FILE.read_text()
    grid = sms * ctas_per_sm

    @T.prim_func
    def kernel(out: T.Tensor((grid * threads,), "float32"), seed: T.int32):
        with T.Kernel(grid, threads=threads) as (_,):
            T.import_source(source)
            T.call_extern(
                "handle", f"mma_sync_peak::run<{chains}, {steps}>", T.address_of(out[0]), seed
            )

    return tilelang.compile(
        kernel, execution_backend="tvm_ffi", pass_configs=tilelang_build.ampere_pass_configs()
    )


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    import torch

    from benchmarks.runner import CudaTimer, device_info

    if not torch.cuda.is_available():
        raise SystemExit(
            "sparse_mla_mma_sync_peak: needs a CUDA GPU (torch.cuda.is_available() is False)"
        )
    info = device_info()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(
        f"{info['gpu']} ({sms} SMs) | torch {info['torch']} | tilelang {info['tilelang']} | "
        f"mma.sync.m16n8k16 bf16 -> fp32, {STEPS} MMAs per chain, median of 30, TFLOP/s"
    )
    timer = CudaTimer(reps=30)
    for threads, ctas_per_sm in SHAPES:
        out = torch.zeros(sms * ctas_per_sm * threads, device="cuda")
        rates = []
        for chains in CHAINS:
            kernel = build(sms, ctas_per_sm, threads, chains)
            us = timer(lambda kernel=kernel, out=out: kernel(out, 7)).median_us
            tflops = flops(sms, ctas_per_sm, threads, chains) / us / 1e6
            rates.append(f"{chains} chains {tflops:6.1f}")
        warps = threads // 32 * ctas_per_sm
        shape = f"{warps:2d} warps/SM ({ctas_per_sm} CTAs of {threads})"
        print(f"{shape}: " + "  ".join(rates), flush=True)
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = timer(lambda: a @ b).median_us
    print(f"torch.matmul {n}^3 bf16 (cuBLAS): {2 * n**3 / us / 1e6:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
