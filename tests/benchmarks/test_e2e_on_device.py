"""scripts/e2e-on-device: the GPU machine's driver, run here with stand-ins for make."""

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "e2e-on-device"


def _run(tmp_path, *args, path_prefix=None):
    env = {**os.environ, "E2E_HOME": str(tmp_path / "home")}
    if path_prefix:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def _wait_done(path: Path, seconds: float = 30) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), f"{path} never appeared"
    for _ in range(50):  # written by `echo $? >`: wait for the line to land
        text = path.read_text().strip()
        if text:
            return text
        time.sleep(0.1)
    return path.read_text().strip()


def test_tests_runs_the_gpu_tier_with_the_stack_on_pythonpath_detached(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "make").write_text(
        '#!/bin/sh\necho "args: $*"\necho "pythonpath: $PYTHONPATH"\nexit 3\n'
    )
    (fake / "make").chmod(0o755)
    run = _run(tmp_path, "tests", path_prefix=str(fake))
    assert run.returncode == 0, run.stderr
    out = tmp_path / "home" / "out"
    assert _wait_done(out / "tests.done") == "3"  # make's exit status is kept
    log = (out / "tests.log").read_text()
    assert "test-gpu PYTHON=python3 DEEPINFER_REQUIRE_VLLM=1" in log
    assert f"--junitxml={out}/tests.xml" in log
    # The unpacked stack first, then the overlay, the checkout and the plugin's dist-info.
    site = tmp_path / "home" / "site"
    assert f"pythonpath: {site}:{ROOT / 'overlay'}:{ROOT}:{tmp_path / 'home' / 'meta'}" in log


def test_unknown_commands_are_refused(tmp_path):
    run = _run(tmp_path, "bogus")
    assert run.returncode == 2 and "unknown command bogus" in run.stderr
