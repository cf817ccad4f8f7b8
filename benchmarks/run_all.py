"""``make bench``: every microbenchmark suite, then the charts when matplotlib exists.

python -m benchmarks.run_all                     # all suites
python -m benchmarks.run_all --suite mhc --suite indexer
"""

import argparse
import importlib.util
import sys

from benchmarks import (
    microbench_indexer_logits,
    microbench_inv_rope,
    microbench_kv_cache,
    microbench_mhc,
    microbench_sparse_mla,
    microbench_topk_swa,
)
from benchmarks.runner import main_for_suite

# One suite per module, benchmarks/microbench_<op>.py, each named for the op it measures.
# The suite names are keys of the result files and stay as they were: microbench_indexer_logits
# runs suite `indexer`, microbench_inv_rope suite `o_proj`.
SUITES = {
    microbench_sparse_mla.SUITE: microbench_sparse_mla.build_registry,
    microbench_kv_cache.SUITE: microbench_kv_cache.build_registry,
    microbench_mhc.SUITE: microbench_mhc.build_registry,
    microbench_topk_swa.SUITE: microbench_topk_swa.build_registry,
    microbench_indexer_logits.SUITE: microbench_indexer_logits.build_registry,
    microbench_inv_rope.SUITE: microbench_inv_rope.build_registry,
}
# Suites whose kernels need more than torch + triton.
NEEDS = {microbench_mhc.SUITE: "tilelang"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", action="append", choices=sorted(SUITES), help="repeatable")
    p.add_argument("--no-charts", action="store_true")
    args = p.parse_args(argv)
    rc = 0
    for suite in args.suite or list(SUITES):
        need = NEEDS.get(suite)
        if need and importlib.util.find_spec(need) is None:
            print(f"[{suite}] not run: needs `{need}` in this Python (pip install it)")
            rc = 1
            continue
        rc |= main_for_suite(suite, SUITES[suite]())
    if args.no_charts:
        return rc
    if importlib.util.find_spec("matplotlib") is None:
        print("charts not drawn: matplotlib is not installed (make charts PYTHON=... later)")
        return rc
    from benchmarks import generate_charts

    return rc | generate_charts.main([])


if __name__ == "__main__":
    sys.exit(main())
