"""generate_charts draws one PNG per suite from the results, failed checks included."""

import json

import pytest

pytest.importorskip("matplotlib")

from benchmarks import generate_charts
from benchmarks.runner import RESULTS_DIR, SUMMARY_FILE


def _case(name, ok=True):
    row = {"case": name, "status": "ok" if ok else "correctness-failed: not timed"}
    if ok:
        row.update(candidate_us={"median": 5.0}, baseline_us={"median": 50.0}, speedup=10.0)
    return row


def test_charts_from_a_summary(tmp_path):
    summary = {
        "GPU_A": {
            "suites": {
                "s1": {
                    "label": "GPU A | torch x | triton y",
                    "cases": [_case("a"), _case("b", ok=False)],
                }
            }
        },
        "GPU_B": {
            "suites": {
                "s1": {"label": "GPU B | torch x | triton y", "cases": [_case("a"), _case("b")]}
            }
        },
    }
    f = tmp_path / "summary.json"
    f.write_text(json.dumps(summary))
    assert generate_charts.main(["--summary", str(f), "--out", str(tmp_path / "png")]) == 0
    png = tmp_path / "png" / "s1.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_charts_from_the_committed_results(tmp_path):
    summary = RESULTS_DIR / SUMMARY_FILE
    if not summary.exists():
        pytest.skip("no benchmark results committed")
    assert generate_charts.main(["--summary", str(summary), "--out", str(tmp_path)]) == 0
    drawn = {p.stem for p in tmp_path.glob("*.png")}
    assert drawn >= {"sparse_mla", "kv_cache", "mhc", "topk_swa", "indexer", "o_proj"}
    # The committed charts are those of the committed results, one per suite, no other.
    assert {p.stem for p in (RESULTS_DIR / "charts").glob("*.png")} == drawn
