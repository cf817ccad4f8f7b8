"""benchmarks/e2e's phases end to end against stand-in servers (tests/benchmarks/fake_vllm.py).

Real ``vllm serve`` processes need a GPU; the stand-ins speak the same API, so the
orchestration (launcher rendering, server lifecycle, probes, `deepinfer launch` and
`deepinfer health --ready`, /metrics, the report) is checked here, including that a
perturbed checkpoint is flagged.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_BIN = Path(__file__).parent / "fake_bin"


def _checkpoint(d: Path) -> str:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": 512}))
    vocab = {f"b{i}": i for i in range(512)}
    added = [{"id": i} for i in range(256, 512)]
    (d / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": vocab}, "added_tokens": added})
    )
    return str(d)


def _run(*args, out: Path) -> subprocess.CompletedProcess:
    deepinfer = shutil.which("deepinfer") or str(Path(sys.executable).parent / "deepinfer")
    env = {
        **os.environ,
        "FAKE_PYTHON": sys.executable,
        "PATH": f"{FAKE_BIN}:{Path(deepinfer).parent}:{os.environ['PATH']}",
        "PYTHONPATH": f"{ROOT / 'overlay'}:{ROOT}",
    }
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.e2e", *args, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip


def test_phases_and_report_against_stand_in_servers(tmp_path):
    model = _checkpoint(tmp_path / "smoke")
    perturbed = _checkpoint(tmp_path / "smoke-perturbed")
    out = tmp_path / "out"
    common = ["--model", model, "--max-len", "300", "--stagger-s", "0"]
    r = _run("correctness", *common, "--perturbed", perturbed, out=out)
    assert r.returncode == 0, r.stdout + r.stderr
    corr = json.loads((out / "correctness.json").read_text())
    assert all("ready_s" in s for s in corr["servers"].values()), corr["servers"]
    assert "--enforce-eager" in corr["servers"]["stock-eager"]["argv"]
    assert "--enforce-eager" not in corr["servers"]["ours-graphs"]["argv"]
    assert set(corr["throughput"]) == {"stock-graphs", "ours-graphs"}
    assert corr["throughput"]["ours-graphs"]["decode_c16"]["aggregate_tok_s"] > 0
    r = _run("speculative", *common, out=out)
    assert r.returncode == 0, r.stdout + r.stderr
    spec = json.loads((out / "speculative.json").read_text())
    assert spec["servers"]["ours-spec-launch"]["argv"][:2] == ["deepinfer", "launch"]
    assert spec["health"]["ours-spec-launch"]["rc"] == 0
    r = _run("report", out=out)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    comps = rep["comparisons"]
    assert comps["ours vs stock, CUDA graphs, batch 16"]["within"]
    assert not comps["NEGATIVE CONTROL: 1% attention change vs stock (eager)"]["within"]
    eq = rep["speculative"]["ours-spec-launch greedy vs ours-graphs greedy"]
    assert eq["equal_prompts"] == eq["prompts"] > 0
    assert "OUTSIDE" in r.stdout and "WITHIN" in r.stdout


def test_a_server_that_dies_is_reported_not_fatal(tmp_path, monkeypatch):
    model = _checkpoint(tmp_path / "smoke")
    out = tmp_path / "out"
    monkeypatch.setenv("FAKE_VLLM_EXIT", "stock-eager-chunk2048")
    r = _run("correctness", "--model", model, "--perturbed", model, "--max-len", "100",
             "--stagger-s", "0", "--no-throughput", out=out)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    corr = json.loads((out / "correctness.json").read_text())
    assert "exited with 3" in corr["servers"]["stock-eager-chunk2048"]["error"]
    assert "ready_s" in corr["servers"]["stock-eager"]
    with pytest.raises(KeyError):
        corr["runs"]["stock-eager-chunk2048"]
