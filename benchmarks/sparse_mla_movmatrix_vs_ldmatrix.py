"""What building P.V's A fragment costs: ``movmatrix`` from registers against ``ldmatrix``
from shared memory, each feeding one mma.sync.m16n8k16 per fragment, beside the MMAs
alone on fixed fragments, at the decode kernels' occupancies (8 and 16 warps per SM) and
1, 2 or 4 independent chains per warp.

Why: the sparse-MLA narrow kernel builds V^T's A fragments with four ``movmatrix`` each
(its register path for P.V); a transposed kernel with heads as the MMA's N dimension would
read them with one ``ldmatrix.x4.trans`` from a padded shared tile instead. The kernel
moves no global memory, so each figure is a ceiling for its path, not a model of the
decode. The instructions are the kernel's own helpers (``deepinfer_mla::movmatrix_trans``,
``ldsm_x4_trans``, ``mma_bf16`` in ``ops/sparse_mla/attention_sm80.cuh``).

Run on a CUDA GPU: ``PYTHONPATH=overlay:. python -m benchmarks.sparse_mla_movmatrix_vs_ldmatrix``.
The builds fit sm_80/sm_86 (``tests/benchmarks/test_sparse_mla_movmatrix_vs_ldmatrix.py``, no GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from deepinfer_sm80 import tilelang_build
from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import SOURCE_FILE as ATTENTION_SOURCE

SOURCE_FILE = Path(__file__).with_name("sparse_mla_movmatrix_vs_ldmatrix.cuh")
MODES = {"mma only": 0, "movmatrix": 1, "ldmatrix": 2}  # kMmaOnly, kMovmatrix, kLdmatrix
TILE_BYTES = 16 * 24 * 2  # one padded 16 x 16 bf16 fragment (kTileHalves)
STEPS = 4096  # fragments per chain
MMA_FLOPS = 2 * 16 * 8 * 16
# (threads per CTA, CTAs per SM): 8 warps/SM as one decode CTA, 16 as two.
SHAPES = ((256, 1), (256, 2))
CHAINS = (1, 2, 4)


@dataclasses.dataclass(frozen=True)
class FragmentVariant:
    """One build: a mode of building fragments, chains per warp, a launch shape."""

    mode: str
    chains: int
    threads_per_cta: int = 256
    ctas: int = 1  # the grid (the GPU's SMs x CTAs per SM); not part of the fit
    steps: int = STEPS

    @property
    def label(self) -> str:
        return f"movmatrix_vs_ldmatrix.{self.mode.replace(' ', '_')}[c{self.chains}]"

    def threads(self) -> int:
        return self.threads_per_cta

    def smem_bytes(self) -> int:
        return (self.threads_per_cta // 32) * self.chains * TILE_BYTES

    def pass_configs(self) -> dict:
        return tilelang_build.ampere_pass_configs()

    def build(self):
        import tilelang.language as T  # noqa: N812 -- TileLang's own spelling

        source = ATTENTION_SOURCE.read_text() + "\n" + SOURCE_FILE.read_text()
        callee = f"movmatrix_vs_ldmatrix::run<{MODES[self.mode]}, {self.chains}, {self.steps}>"
        grid, threads, smem = self.ctas, self.threads_per_cta, self.smem_bytes()

        @T.prim_func
        def kernel(out: T.Tensor((grid * threads,), "float32"), seed: T.int32):
            with T.Kernel(grid, threads=threads) as (_,):
                T.import_source(source)
                buf = T.alloc_shared((smem,), "uint8")
                T.call_extern("handle", callee, T.address_of(out[0]), seed, T.address_of(buf[0]))

        return kernel


def fragments(v: FragmentVariant) -> int:
    """Fragments (and MMAs) of one launch: every warp builds chains x steps of them."""
    return v.ctas * (v.threads_per_cta // 32) * v.chains * v.steps


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    import torch

    from benchmarks.runner import CudaTimer, device_info

    if not torch.cuda.is_available():
        raise SystemExit(
            "sparse_mla_movmatrix_vs_ldmatrix: needs a CUDA GPU "
            "(torch.cuda.is_available() is False)"
        )
    info = device_info()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(
        f"{info['gpu']} ({sms} SMs) | torch {info['torch']} | tilelang {info['tilelang']} | "
        f"{STEPS} fragments per chain, each one mma.sync.m16n8k16, median of 30; "
        "per SM: ns per fragment, and the mma.sync rate in TFLOP/s"
    )
    timer = CudaTimer(reps=30)
    for threads, ctas_per_sm in SHAPES:
        out = torch.zeros(sms * ctas_per_sm * threads, device="cuda")
        for chains in CHAINS:
            cells = []
            for mode in MODES:
                v = FragmentVariant(mode, chains, threads, ctas=sms * ctas_per_sm)
                kernel = tilelang_build.get_kernel(v)
                us = timer(lambda kernel=kernel, out=out: kernel(out, 7)).median_us
                per_sm_ns = us * 1e3 / (fragments(v) / sms)
                tflops = fragments(v) * MMA_FLOPS / us / 1e6
                cells.append(f"{mode} {per_sm_ns:6.3f} ns {tflops:6.1f} TF/s")
            warps = threads // 32 * ctas_per_sm
            print(f"{warps:2d} warps/SM, {chains} chains: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
