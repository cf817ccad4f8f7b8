"""A/B of the TileLang sparse-MLA decode's launch-grid order (arch.py ``SPLITS_FASTEST``).

A: grid (tokens, head blocks, splits), token fastest (the shipped order). B: a 1-D grid
with the split fastest (``AttentionVariant.splits_fastest``), so a token's splits run side
by side. For 8, 32 and 64 heads per rank, T in (16, 64, 256) and both split modes
(``engine.decode_split_mode``: latency, throughput) on the sparse_mla suite's decode
inputs (``microbench_sparse_mla.decode_inputs``: SWA 128 + Top-K 512, every row used),
both orders run in this one process: their ``out`` and ``lse`` must be bit-identical
(no speed-up is reported otherwise), then each is timed as GPU work only with CUDA
events, cold L2, A and B interleaved rep by rep (``runner.CudaTimer.interleaved``).
One line per case, and a JSON report at ``--out``.

Run (CUDA GPU with TileLang): ``PYTHONPATH=overlay:. python3 -m
benchmarks.sparse_mla_ab_grid_order --out results.json``
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from benchmarks.sparse_mla_decode_config import (
    WIDTHS,
    AbCase,
    ab_parser,
    check_reps_and_tokens,
    decode_constexpr,
    run_on_tilelang,
    start_ab_run,
    write_report,
)
from benchmarks.sparse_mla_decode_config import cases as ab_cases

HEADS = (8, 32, 64)
TOKENS = (16, 64, 256)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ab_parser(__doc__.splitlines()[0], HEADS, TOKENS)
    args = parser.parse_args(argv)
    check_reps_and_tokens(parser, args)
    if any(not 0 < h <= 64 for h in args.heads):
        parser.error("--heads: 1..64 (the inputs pad to 64 heads)")
    return args


def cases(args: argparse.Namespace) -> list[AbCase]:
    return ab_cases(args)


def kernel_builds(case_list: list[AbCase]) -> int:
    """TileLang builds the run needs: per order, one per kernel (narrow for <= 8 heads,
    else wide) and split size (latency and throughput differ at 640 rows)."""
    kinds = {(c.heads <= 8, c.splits) for c in case_list}
    return 2 * len(kinds)


def grid_order(splits_fastest: bool):
    """arch.py's TileLang decode config with SPLITS_FASTEST set, for the block's calls."""
    return decode_constexpr("SPLITS_FASTEST", int(splits_fastest))


def _bits(t):
    import torch

    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def run_case(case: AbCase, timer) -> dict:
    import torch

    from benchmarks.microbench_sparse_mla import decode_inputs, run_decode

    st = decode_inputs(case.T, case.heads, *WIDTHS)

    def call(splits_fastest: bool):
        with grid_order(splits_fastest):  # A writes outs[0], B outs[1]
            return run_decode(st, case.heads, case.splits, out_slot=int(splits_fastest))

    row: dict = {"case": case.name, **dataclasses.asdict(case)}
    got = {}
    for order in (False, True):
        t0 = time.perf_counter()
        out, lse = call(order)
        torch.cuda.synchronize()
        row["first_call_s_" + ("b" if order else "a")] = round(time.perf_counter() - t0, 2)
        h = case.heads
        got[order] = (out[:, :h].clone(), lse[:, :h].clone())
    (out_a, lse_a), (out_b, lse_b) = got[False], got[True]
    row["bitwise_equal"] = bool(
        torch.equal(_bits(out_a), _bits(out_b)) and torch.equal(_bits(lse_a), _bits(lse_b))
    )
    if not row["bitwise_equal"]:
        row["max_abs_diff_out"] = (out_a.float() - out_b.float()).abs().max().item()
        return row
    t_a, t_b = timer.interleaved([lambda: call(False), lambda: call(True)])
    row.update(
        a_median_us=t_a.median_us,
        a_p80_us=t_a.p80_us,
        b_median_us=t_b.median_us,
        b_p80_us=t_b.p80_us,
        speedup_median=t_a.median_us / t_b.median_us,
        speedup_p80=t_a.p80_us / t_b.p80_us,
    )
    return row


def _line(row: dict, gpu: str) -> str:
    head = f"{gpu} | {row['case']:22s}"
    if not row["bitwise_equal"]:
        diff = row["max_abs_diff_out"]
        return f"{head} | OUTPUTS DIFFER (max |out A - out B| {diff:.3g}): not timed"
    return (
        f"{head} | A token-fastest {row['a_median_us']:8.1f} us (p80 {row['a_p80_us']:8.1f})"
        f" | B splits-fastest {row['b_median_us']:8.1f} us (p80 {row['b_p80_us']:8.1f})"
        f" | A/B {row['speedup_median']:.3f}x (p80 {row['speedup_p80']:.3f}x) | bitwise equal"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deepinfer_sm80 import tilelang_build

    start = time.perf_counter()
    started = start_ab_run("sparse_mla_ab_grid_order", args.reps)
    if started is None:
        return 2
    info, timer = started
    case_list = cases(args)
    builds_before = set(tilelang_build._compiled)
    rows = run_on_tilelang(
        case_list, lambda case: run_case(case, timer), _line, info.get("gpu", "?")
    )
    builds = sorted(v.label for v, _ in set(tilelang_build._compiled) - builds_before)
    compiles = len(builds)
    report = {
        "benchmark": "ab_decode_grid_order",
        "device": info,
        "reps": args.reps,
        "widths": list(WIDTHS),
        "a": "token fastest: grid (tokens, head blocks, splits)",
        "b": "splits fastest: 1-D grid, CTA = split + splits * (head block + blocks * token)",
        "tilelang_builds": compiles,
        "tilelang_builds_expected": kernel_builds(case_list),
        "tilelang_build_labels": builds,
        "first_calls_s": round(sum(r["first_call_s_a"] + r["first_call_s_b"] for r in rows), 1),
        "wall_s": round(time.perf_counter() - start, 1),
        "all_bitwise_equal": all(r["bitwise_equal"] for r in rows),
        "cases": rows,
    }
    write_report(args.out, report)
    print(
        f"{len(rows)} cases, {compiles} TileLang builds, first calls {report['first_calls_s']} s,"
        f" wall {report['wall_s']} s, all bitwise equal: {report['all_bitwise_equal']};"
        f" wrote {args.out}",
        flush=True,
    )
    return 0 if report["all_bitwise_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
