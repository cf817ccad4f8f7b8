"""The e2e tier (`make e2e`): vLLM 0.33.0 serves the smoke checkpoint on this CUDA GPU through
the launcher's command, by its own path and by ours, and the comparison must pass.

Selected only on purpose (`-m e2e`), so what it needs is required: no GPU or no vLLM is a
failure, not a skip. benchmarks/e2e/README.md says what each phase does.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.fail("the e2e tier needs a CUDA GPU (torch sees none)")
    try:
        import vllm
    except ImportError as exc:
        pytest.fail(f"the e2e tier needs vLLM 0.33.0 importable: {exc}")
    assert vllm.__version__ == "0.33.0", vllm.__version__
    from benchmarks.e2e.run import CONTROLS

    root = tmp_path_factory.mktemp("smoke")
    model = root / "smoke"  # the controls' checkpoints beside it, where correctness looks
    writes = [[str(model)]] + [
        [str(root / c.checkpoint), "--perturb-layer", str(c.layer), "--perturb-rel", str(c.rel)]
        for c in CONTROLS
    ]
    for args in writes:
        r = _run("-m", "deepinfer_sm80.smoke_model", *args, "--seed", "0", timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
    return model


def test_ours_agrees_with_stock_and_the_control_is_flagged(checkpoints, tmp_path):
    model = checkpoints
    out = tmp_path / "out"
    for phase in ("correctness", "speculative"):
        r = _run("-m", "benchmarks.e2e", phase, "--model", str(model), "--out", str(out),
                 timeout=1800)  # fmt: skip
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    r = _run("-m", "benchmarks.e2e", "report", "--out", str(out), timeout=600)
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"]["result"] == "PASS", r.stdout
    assert rep["health"]["ours-spec-launch"]["rc"] == 0, rep["health"]
    eq = rep["speculative"]["ours-spec-launch greedy vs ours-graphs greedy"]
    assert eq["equal_prompts"] == eq["prompts"], eq["first_divergence"]
