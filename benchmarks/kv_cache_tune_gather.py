"""Pick the gather's launch config by measurement: ``--tune`` style sweep.

Prints GB/s (584 B read + 1,024 B written per row) for each (ROWS, num_warps,
num_stages, program cap) on a 48K gather, checking every config bit-exact against the
shipped one first. The winner is written into ``deepinfer_sm80/arch.py`` by hand, with
the GPU it was measured on.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.kv_cache_tune_gather``
"""

import dataclasses
import itertools

import torch

from benchmarks.microbench_kv_cache import build_registry
from benchmarks.runner import CudaTimer, device_info, exact_check
from deepinfer_sm80 import arch
from deepinfer_sm80.ops.kv_cache import triton_kernel
from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES

SWEEP = {
    "rows_warps": [(4, 1), (8, 1), (8, 2), (8, 4), (16, 2), (16, 4)],
    "stages": [1],
    "max_programs": [8192],
}


def main() -> None:
    info = device_info()
    print(f"{info['gpu']} | torch {info['torch']} | triton {info['triton']}")
    case = next(c for c in build_registry().cases() if c.name == "gather_48K")
    state = case.setup()
    reference = case.candidate(state).clone()
    timer = CudaTimer()
    shipped = arch.KERNEL_CONFIGS["kv_cache.gather"]
    shipped_cap = triton_kernel._GATHER_MAX_PROGRAMS
    rows_total = sum(case.params["lens"])
    try:
        for (rows, warps), stages, cap in itertools.product(*SWEEP.values()):
            arch.KERNEL_CONFIGS["kv_cache.gather"] = dataclasses.replace(
                shipped, num_warps=warps, num_stages=stages, constexprs=(("ROWS", rows),)
            )
            triton_kernel._GATHER_MAX_PROGRAMS = cap
            name = f"ROWS={rows:2} warps={warps} stages={stages} cap={cap:5}"
            state[3].fill_(float("nan"))
            check = exact_check(reference, case.candidate(state))
            if not check.ok:
                print(f"{name}: WRONG ({check.detail})")
                continue
            t = timer(lambda: case.candidate(state))
            gbs = rows_total * (RECORD_BYTES + 1024) / (t.median_us * 1e-6) / 1e9
            print(f"{name}: {t.median_us:8.2f} us {gbs:7.0f} GB/s", flush=True)
    finally:
        arch.KERNEL_CONFIGS["kv_cache.gather"] = shipped
        triton_kernel._GATHER_MAX_PROGRAMS = shipped_cap
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
