"""Kernel-level GPU times of one sparse-MLA decode call (torch.profiler), to see where
the time goes. Run: ``PYTHONPATH=overlay:. python -m benchmarks.sparse_mla_profile``"""

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.microbench_sparse_mla import build_registry


def main() -> None:
    cases = {c.name: c for c in build_registry().cases()}
    for name in (
        "mla_decode_T1_H64_w128+512",
        "mla_decode_T64_H64_w128+512",
        "mla_decode_T5_H32_w192+0",
        "mla_prefill_T1024_H16_ctx16K",
    ):
        case = cases[name]
        state = case.setup()
        for _ in range(3):
            case.candidate(state)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                case.candidate(state)
            torch.cuda.synchronize()
        print(f"== {name}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6))


if __name__ == "__main__":
    main()
