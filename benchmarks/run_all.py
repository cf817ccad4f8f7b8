"""``make bench``: every microbenchmark suite, then the charts when matplotlib exists."""

import sys

from benchmarks import (
    microbench_sm80_indexer,
    microbench_sm80_kernels,
    microbench_sm80_o_proj,
    microbench_sm80_part2,
    microbench_sm80_part3,
)
from benchmarks.runner import main_for_suite

SUITES = (
    (microbench_sm80_kernels.SUITE, microbench_sm80_kernels.build_registry),
    (microbench_sm80_part2.SUITE, microbench_sm80_part2.build_registry),
    (microbench_sm80_part3.SUITE, microbench_sm80_part3.build_registry),
    (microbench_sm80_indexer.SUITE, microbench_sm80_indexer.build_registry),
    (microbench_sm80_o_proj.SUITE, microbench_sm80_o_proj.build_registry),
)


def main() -> int:
    rc = 0
    for suite, build in SUITES:
        rc |= main_for_suite(suite, build())
    return rc


if __name__ == "__main__":
    sys.exit(main())
