"""PNG charts from the benchmark results: per suite, latency and speed-up per case,
grouped by GPU, each labelled with the GPU and the versions it ran with.

Reads ``benchmarks/results/sm80_benchmark_summary.json`` (written by ``make bench``) and
writes ``benchmarks/results/charts/<suite>.png``. Cases whose correctness check failed
were never timed; they are shown as such, not as zero.

Run: ``python -m benchmarks.generate_charts [--summary FILE] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"


def _suites(summary: dict) -> dict[str, list[tuple[str, dict]]]:
    """suite -> [(gpu label, suite report)]"""
    out: dict[str, list[tuple[str, dict]]] = {}
    for per_gpu in summary.values():
        for suite, report in per_gpu.get("suites", {}).items():
            out.setdefault(suite, []).append((report.get("label", "?"), report))
    return out


def chart_suite(suite: str, reports: list[tuple[str, dict]], out_dir: Path) -> Path:
    n_cases = max(len(r["cases"]) for _, r in reports)
    fig, (ax_t, ax_s) = plt.subplots(2, 1, figsize=(max(8, 0.55 * n_cases + 3), 9))
    width = 0.8 / (2 * len(reports))
    for g, (label, report) in enumerate(reports):
        names = [c["case"] for c in report["cases"]]
        xs = range(len(names))
        cand = [
            c["candidate_us"]["median"] if c.get("status") == "ok" else 0 for c in report["cases"]
        ]
        base = [
            c["baseline_us"]["median"] if c.get("status") == "ok" else 0 for c in report["cases"]
        ]
        gpu = label.split(" | ")[0]
        off = (2 * g) * width
        ax_t.bar([x + off for x in xs], base, width, label=f"baseline ({gpu})", alpha=0.6)
        ax_t.bar([x + off + width for x in xs], cand, width, label=f"ours ({gpu})")
        speed = [c.get("speedup", 0) for c in report["cases"]]
        ax_s.bar([x + off for x in xs], speed, 2 * width, label=gpu)
        for x, c in zip(xs, report["cases"], strict=True):
            if c.get("status") != "ok":
                ax_t.text(x + off, 1, "check failed:\nnot timed", rotation=90, fontsize=7)
        ax_s.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=7)
        ax_t.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=7)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("median latency (us, log)")
    ax_t.legend(fontsize=7)
    ax_s.axhline(1.0, color="grey", linewidth=0.8)
    ax_s.set_ylabel("speed-up over the baseline (x)")
    ax_s.legend(fontsize=7)
    labels = "\n".join(label for label, _ in reports)
    fig.suptitle(f"suite {suite}\n{labels}", fontsize=9)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{suite}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--summary", type=Path, default=RESULTS / "sm80_benchmark_summary.json")
    p.add_argument("--out", type=Path, default=RESULTS / "charts")
    args = p.parse_args(argv)
    if not args.summary.exists():
        print(f"error: {args.summary} does not exist; run `make bench` first")
        return 2
    for suite, reports in sorted(_suites(json.loads(args.summary.read_text())).items()):
        print(chart_suite(suite, reports, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
