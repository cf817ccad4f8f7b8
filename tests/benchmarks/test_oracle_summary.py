"""benchmarks/oracle_summary.py: the published oracle tables come from the record file."""

import json
from pathlib import Path

import pytest

from benchmarks import oracle_summary

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_the_published_summary_is_the_record_rendered():
    """The summary in benchmarks/results is exactly what the script makes of the record it
    names: a figure edited by hand, or a record changed without the summary, fails."""
    recs = oracle_summary.load(RESULTS / "NVIDIA_H100.gpu_oracles.jsonl")
    want = oracle_summary.render(recs, "NVIDIA_H100.gpu_oracles.jsonl")
    assert (RESULTS / "NVIDIA_H100.gpu_oracles_summary.txt").read_text() == want


def _attention(case, ratio):
    errs = {"max_abs": 0.1, "rel_norm": 0.001}
    return {"case": case, "gpu": "G", "ours_vs_fp64": errs, "oracle_vs_fp64": errs,
            "rel_norm_ratio": ratio, "max_abs_ratio": 1.0,
            "ours_vs_oracle": {"worst_element_vs_bound": 0.25}}  # fmt: skip


def test_rehearsal_records_and_everything_after_them_are_left_out():
    recs = [
        _attention("decode H8", 1.01),
        {"case": "prefill logits H32", "gpu": "G", "worst_vs_bound": 0.02, "oracle_worst": 0.03},
        _attention("decode rehearsal H8", 1.3),
        {"case": "prefill logits H32", "gpu": "G", "worst_vs_bound": 0.0, "oracle_worst": 0.0},
    ]
    text = oracle_summary.render(recs, "r.jsonl")
    assert "# 2 oracle records from r.jsonl, on G" in text
    assert "left out: the last 2 records" in text
    assert "rehearsal" not in text.split("\n", 2)[2]
    assert "1 cases: rel-norm ratio 1.0100-1.0100" in text
    assert text.count("prefill logits H32") == 1 and "0.0200    0.0300" in text


def test_a_bad_record_file_is_named(tmp_path):
    bad = tmp_path / "r.jsonl"
    bad.write_text(json.dumps({"case": "a"}) + "\nnot json\n")
    with pytest.raises(ValueError, match=r"r.jsonl:2: not a JSON record"):
        oracle_summary.load(bad)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        oracle_summary.load(tmp_path / "empty.jsonl")
    assert oracle_summary.main([str(tmp_path / "missing.jsonl")]) == 2
