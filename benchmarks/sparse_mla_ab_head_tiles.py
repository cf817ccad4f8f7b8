"""A/B of the TileLang sparse-MLA decode at more than 8 heads per rank: the wide kernel
as shipped (arch.py ``HEAD_TILES`` 1, ``QK_REGISTERS`` 0, ``CTAS_PER_SM`` 2; 16 heads per
CTA) against a
candidate structure, ``--candidate``:
- ``head-tiles`` (default): the narrow kernel with n-tiles of heads (``HEAD_TILES`` 2 or
  4, ``--tiles``: 16 or 32 heads per CTA, each row loaded and decoded once for all of
  them; ``AttentionVariant.head_tiles``);
- ``qk-registers``: the wide kernel with QK's B fragments taken from the NoPE warps'
  decoded registers instead of ldmatrix (``QK_REGISTERS`` 1;
  ``AttentionVariant.qk_registers``);
- ``ctas-3``: the wide kernel built for 3 CTAs per SM instead of 2 (``CTAS_PER_SM`` 3,
  ``AttentionVariant.ctas_per_sm``: 80 registers, 12 warps per SM).

For 16, 32 and 64 heads per rank, T in (1, 4, 16, 64, 256) and both split modes
(``engine.decode_split_mode``) on the sparse_mla suite's decode inputs
(``microbench_sparse_mla.decode_inputs``: SWA 128 + Top-K 512, every row used), A and B
run in this one process. B's output must be within 1e-2 relative Frobenius error of A's
and its lse within 1e-3 of A's (the two kernels round differently; each is checked
against the fp64 reference on the GPU tier, ``test_head_tile_kernel_against_the_reference``):
otherwise no time is reported. Then both are timed as GPU work only with CUDA events,
cold L2, interleaved rep by rep (``runner.CudaTimer.interleaved``), and each case is put
against its own roofline: max(bytes / copy bandwidth, FLOP / mma.sync ceiling), both
measured here (the ceiling: ``sparse_mla_mma_sync_peak``'s kernel at 16 warps per SM,
the best of 2, 4 and 8 chains). One line per case, and a JSON report at ``--out``.

Run (CUDA GPU with TileLang): ``PYTHONPATH=overlay:. python3 -m
benchmarks.sparse_mla_ab_head_tiles --out results.json``
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

HEADS = (16, 32, 64)
CANDIDATES = ("head-tiles", "qk-registers", "ctas-3")
TOKENS = (1, 4, 16, 64, 256)
REL_TOL = 1e-2
LSE_ATOL = 1e-3
# lse is fp32 and, on these inputs, runs to about 2^21 (a few fp32 ulps are 0.125-0.25):
# the two kernels track the running maximum over different tiles.
LSE_RTOL = 1e-5


class RooflineCase(AbCase):
    """A case with the terms of its roofline."""

    def bytes_moved(self) -> int:
        """Records read once per token; q read and out written per real head."""
        from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES

        return self.T * (sum(WIDTHS) * RECORD_BYTES + self.heads * 512 * 2 * 2)

    def flops(self) -> int:
        return self.T * self.heads * sum(WIDTHS) * 512 * 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ab_parser(__doc__.splitlines()[0], HEADS, TOKENS)
    parser.add_argument("--candidate", default="head-tiles", choices=CANDIDATES, help="what B runs")
    parser.add_argument(
        "--tiles",
        type=int,
        default=4,
        choices=(2, 4),
        help="head-tiles: B HEAD_TILES (default 4)",
    )
    args = parser.parse_args(argv)
    check_reps_and_tokens(parser, args)
    if any(not 8 < h <= 64 for h in args.heads):
        parser.error("--heads: 9..64 (8 or fewer run the narrow kernel either way)")
    return args


def cases(args: argparse.Namespace) -> list[RooflineCase]:
    return ab_cases(args, RooflineCase)


def head_tiles(tiles: int):
    """arch.py's TileLang decode config with HEAD_TILES set, for the block's calls."""
    return decode_constexpr("HEAD_TILES", tiles)


def candidate_config(candidate: str, tiles: int, b: bool):
    """The config A (``b`` False: as shipped) or B runs under."""
    if candidate == "qk-registers":
        return decode_constexpr("QK_REGISTERS", int(b))
    if candidate == "ctas-3":
        return decode_constexpr("CTAS_PER_SM", 3 if b else 2)
    return head_tiles(tiles if b else 1)


def candidate_name(candidate: str, tiles: int) -> str:
    if candidate == "qk-registers":
        return "wide kernel, QK B fragments from decoded registers (QK_REGISTERS 1)"
    if candidate == "ctas-3":
        return "wide kernel, 3 CTAs per SM (CTAS_PER_SM 3)"
    return f"narrow kernel, {tiles} n-tiles of 8 heads per CTA (HEAD_TILES {tiles})"


def agreement(a: tuple, b: tuple) -> dict:
    """B against A: relative Frobenius error of out, largest |lse difference|, finiteness."""
    import torch

    (out_a, lse_a), (out_b, lse_b) = a, b
    finite = bool(torch.isfinite(out_b).all())
    rel = float((out_b.float() - out_a.float()).norm() / out_a.float().norm().clamp_min(1e-30))
    lse = float((lse_b - lse_a).abs().max())
    lse_ok = bool(((lse_b - lse_a).abs() <= LSE_ATOL + LSE_RTOL * lse_a.abs()).all())
    return {
        "rel_err_out": rel,
        "max_abs_diff_lse": lse,
        "agree": finite and rel <= REL_TOL and lse_ok,
    }


def run_case(case: RooflineCase, tiles: int, timer, roofline_s, candidate="head-tiles") -> dict:
    import torch

    from benchmarks.microbench_sparse_mla import decode_inputs, run_decode

    st = decode_inputs(case.T, case.heads, *WIDTHS)

    def call(b: bool):
        with candidate_config(candidate, tiles, b):  # A writes outs[0], B outs[1]
            return run_decode(st, case.heads, case.splits, out_slot=int(b))

    from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import decode_kernel_shape

    with candidate_config(candidate, tiles, True):  # 16 heads take 2 n-tiles at most
        _, used = decode_kernel_shape(case.heads)
    row: dict = {"case": case.name, **dataclasses.asdict(case), "tiles_b": used}
    got = {}
    for b in (False, True):
        t0 = time.perf_counter()
        out, lse = call(b)
        torch.cuda.synchronize()
        row["first_call_s_" + ("b" if b else "a")] = round(time.perf_counter() - t0, 2)
        got[b] = (out[:, : case.heads].clone(), lse[:, : case.heads].clone())
    row.update(agreement(got[False], got[True]))
    if not row["agree"]:
        return row
    t_a, t_b = timer.interleaved([lambda: call(False), lambda: call(True)])
    roof_us = roofline_s(case) * 1e6
    row.update(
        a_median_us=t_a.median_us,
        a_p80_us=t_a.p80_us,
        b_median_us=t_b.median_us,
        b_p80_us=t_b.p80_us,
        speedup_median=t_a.median_us / t_b.median_us,
        speedup_p80=t_a.p80_us / t_b.p80_us,
        roofline_us=roof_us,
        a_roofline_fraction=roof_us / t_a.median_us,
        b_roofline_fraction=roof_us / t_b.median_us,
    )
    return row


def _line(row: dict, gpu: str) -> str:
    head = f"{gpu} | {row['case']:20s}"
    if not row["agree"]:
        return (
            f"{head} | B DISAGREES WITH A (rel err {row['rel_err_out']:.3g}, lse "
            f"{row['max_abs_diff_lse']:.3g}): not timed"
        )
    return (
        f"{head} | A wide {row['a_median_us']:8.1f} us (p80 {row['a_p80_us']:8.1f},"
        f" {row['a_roofline_fraction']:5.1%} of roofline) | B {_b_label(row)}"
        f" {row['b_median_us']:8.1f} us (p80 {row['b_p80_us']:8.1f},"
        f" {row['b_roofline_fraction']:5.1%}) | A/B {row['speedup_median']:.3f}x"
        f" (p80 {row['speedup_p80']:.3f}x) | roofline {row['roofline_us']:.1f} us"
        f" | rel err {row['rel_err_out']:.2e}"
    )


def _b_label(row: dict) -> str:
    labels = {"qk-registers": "qk-regs", "ctas-3": "3 CTAs/SM"}
    if row.get("candidate") in labels:
        return labels[row["candidate"]]
    return f"head tiles x{row['tiles_b']}"


def mma_sync_ceiling_tflops(timer) -> float:
    """sparse_mla_mma_sync_peak's kernel at 16 warps per SM (2 CTAs of 256 threads), the
    best of 2, 4 and 8 independent chains per warp."""
    import torch

    from benchmarks import sparse_mla_mma_sync_peak as peak

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(sms * 2 * 256, device="cuda")
    best = 0.0
    for chains in (2, 4, 8):
        kernel = peak.build(sms, 2, 256, chains)
        us = timer(lambda kernel=kernel: kernel(out, 7)).median_us
        best = max(best, peak.flops(sms, 2, 256, chains) / us / 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks.runner import CudaTimer, measure_copy_bandwidth_gbs

    start = time.perf_counter()
    started = start_ab_run("sparse_mla_ab_head_tiles", args.reps)
    if started is None:
        return 2
    info, timer = started
    copy_gbs = measure_copy_bandwidth_gbs(timer)
    mma_tflops = mma_sync_ceiling_tflops(CudaTimer(reps=30))
    print(
        f"copy bandwidth {copy_gbs:.0f} GB/s, mma.sync ceiling {mma_tflops:.1f} TFLOP/s", flush=True
    )

    def roofline_s(case: RooflineCase) -> float:
        return max(case.bytes_moved() / (copy_gbs * 1e9), case.flops() / (mma_tflops * 1e12))

    rows = run_on_tilelang(
        cases(args),
        lambda case: {
            "candidate": args.candidate,
            **run_case(case, args.tiles, timer, roofline_s, args.candidate),
        },
        _line,
        info.get("gpu", "?"),
    )
    report = {
        "benchmark": "ab_decode_head_tiles",
        "device": info,
        "reps": args.reps,
        "widths": list(WIDTHS),
        "a": "wide kernel as shipped: 16 heads per CTA (HEAD_TILES 1, QK_REGISTERS 0)",
        "b": candidate_name(args.candidate, args.tiles),
        "copy_bandwidth_gbs": copy_gbs,
        "mma_sync_ceiling_tflops": mma_tflops,
        "wall_s": round(time.perf_counter() - start, 1),
        "all_agree": all(r["agree"] for r in rows),
        "cases": rows,
    }
    write_report(args.out, report)
    print(
        f"{len(rows)} cases, wall {report['wall_s']} s, all agree: {report['all_agree']};"
        f" wrote {args.out}",
        flush=True,
    )
    return 0 if report["all_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
