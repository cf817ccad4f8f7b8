"""One sparse-MLA decode call per named case, untimed, for Nsight Compute to profile.

The cases are the kernels suite's (``microbench_sparse_mla``: 128 window rows + 512
compressed rows per token). Each case first runs once (compiling its kernel), then once
more between ``torch.cuda.synchronize()`` calls; profile the second launch of each case
with, for example:

    ncu -k regex:'^kernel' --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy \\
        python3 -m benchmarks.sparse_mla_ncu_decode_call T256_H64_throughput

Run on a CUDA GPU: ``PYTHONPATH=overlay:. python -m benchmarks.sparse_mla_ncu_decode_call CASE...``,
CASE as ``T<tokens>_H<heads>_<latency|throughput>``; ``--head-tiles 4`` runs the
head-tile kernel (arch.py ``HEAD_TILES``) for more than 8 heads; ``--qk-registers`` runs the
wide kernel with QK's B fragments from the decoded registers (arch.py ``QK_REGISTERS``).
"""

from __future__ import annotations

import argparse
import contextlib
import re

CASE = re.compile(r"^T(\d+)_H(8|16|32|64)_(latency|throughput)$")


def parse_case(text: str) -> tuple[int, int, str]:
    """``T256_H64_throughput`` -> ``(256, 64, "throughput")``; a clear error otherwise."""
    m = CASE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"case {text!r}: expected T<tokens>_H<8|16|32|64>_<latency|throughput>, "
            "e.g. T256_H64_throughput"
        )
    return int(m[1]), int(m[2]), m[3]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", type=parse_case, metavar="CASE")
    p.add_argument(
        "--head-tiles",
        type=int,
        choices=(1, 2, 4),
        default=None,
        help="arch.py HEAD_TILES for these calls (default: the shipped value)",
    )
    p.add_argument(
        "--qk-registers",
        action="store_true",
        help="arch.py QK_REGISTERS 1 for these calls (default: the shipped value)",
    )
    args = p.parse_args(argv)
    import torch

    from benchmarks.microbench_sparse_mla import decode_inputs, run_decode
    from benchmarks.sparse_mla_decode_config import decode_constexpr

    if not torch.cuda.is_available():
        raise SystemExit(
            "sparse_mla_ncu_decode_call: needs a CUDA GPU (torch.cuda.is_available() is False)"
        )
    with contextlib.ExitStack() as knobs:
        if args.head_tiles:
            knobs.enter_context(decode_constexpr("HEAD_TILES", args.head_tiles))
        if args.qk_registers:
            knobs.enter_context(decode_constexpr("QK_REGISTERS", 1))
        for T, heads, splits in args.cases:
            st = decode_inputs(T, heads, 128, 512)
            run_decode(st, heads, splits)  # compiles; ncu skips this launch (--launch-skip)
            torch.cuda.synchronize()
            run_decode(st, heads, splits)
            torch.cuda.synchronize()
            print(f"T{T}_H{heads}_{splits}: ran", flush=True)


if __name__ == "__main__":
    main()
