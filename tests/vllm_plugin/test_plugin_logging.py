"""The plugin's INFO lines reach a vLLM server's log (warmup: AOT files seeded, each kernel
ready and how long), whether or not something configured the root logger, and a level
the user set is kept. Each case runs in a fresh interpreter: logging state is global."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    # root configured (as vLLM's processes are, at WARNING): ours still says INFO
    "basic_config": ("logging.basicConfig()", True),
    # nothing configured: ours gets a stderr handler of its own
    "unconfigured": ("", True),
    # the user asked for warnings only: kept
    "user_level": ("logging.getLogger('deepinfer_sm80').setLevel(logging.WARNING)", False),
}
# Run after log_info_by_default: a root handler configured later adds no second copy.
AFTER = {"unconfigured": "logging.basicConfig()"}


@pytest.mark.parametrize("case", CASES)
def test_the_warmup_info_line_reaches_stderr_once(case):
    setup, shown = CASES[case]
    code = (
        "import logging\n"
        f"{setup}\n"
        "from deepinfer_sm80.vllm_plugin import log_info_by_default\n"
        "log_info_by_default(); log_info_by_default()\n"
        f"{AFTER.get(case, '')}\n"
        "logging.getLogger('deepinfer_sm80.warmup').info('sparse MLA: seeded 24 files')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT / 'overlay'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("sparse MLA: seeded 24 files") == (1 if shown else 0), r.stderr
