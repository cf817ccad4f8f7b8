"""scripts/e2e-on-device: the GPU machine's driver, run here with stand-ins for make."""

import os
import subprocess
import sys
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
    # A test per line as it ends (a run cut short still names its failures), and a module
    # that fails to import does not stop the rest.
    assert "-v -rfE" in log and "--continue-on-collection-errors" in log
    # The unpacked stack first, then the overlay, the checkout and the plugin's dist-info.
    site = tmp_path / "home" / "site"
    assert f"pythonpath: {site}:{ROOT / 'overlay'}:{ROOT}:{tmp_path / 'home' / 'meta'}" in log


def test_tests_with_paths_collects_those_files_alone(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "make").write_text('#!/bin/sh\necho "args: $*"\n')
    (fake / "make").chmod(0o755)
    run = _run(tmp_path, "tests", "tests/ops/test_gpu_oracles.py", "tests/ops/test_indexer_q.py",
               path_prefix=str(fake))  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = tmp_path / "home" / "out"
    assert _wait_done(out / "tests.done") == "0"
    args = (out / "tests.log").read_text()
    assert "tests.xml tests/ops/test_gpu_oracles.py tests/ops/test_indexer_q.py\n" in args


def _recording_python3(tmp_path):
    """A python3 on PATH: the real one for the controls' listing (``-m benchmarks.e2e``), a
    recorder of its arguments for smoke_model. Returns (its folder, the record file)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "python3").write_text(
        f'#!/bin/sh\nif [ "$2" = benchmarks.e2e ]; then exec {sys.executable} "$@"; fi\n'
        f'echo "$*" >> {calls}; mkdir -p "$3"\n'
    )
    (fake / "python3").chmod(0o755)
    return fake, calls


def test_checkpoints_writes_the_base_and_every_control_from_the_one_table(tmp_path):
    from benchmarks.e2e.run import CONTROLS

    fake, calls = _recording_python3(tmp_path)
    run = _run(tmp_path, "checkpoints", path_prefix=str(fake))
    assert run.returncode == 0, run.stderr
    home = tmp_path / "home"
    want = [f"-m deepinfer_sm80.smoke_model {home}/smoke --seed 0"] + [
        f"-m deepinfer_sm80.smoke_model {home}/{c.checkpoint} --seed 0 "
        f"--perturb-layer {c.layer} --perturb-rel {c.rel}"
        for c in CONTROLS
    ]
    assert calls.read_text().splitlines() == want
    assert CONTROLS[0].checkpoint == "smoke-perturbed"  # the 1% control keeps its folder
    assert {(c.layer, c.rel) for c in CONTROLS} == {(24, 0.01), (24, 0.1), (24, 0.5), (39, 0.01)}


def test_checkpoints_base_writes_the_smoke_checkpoint_alone(tmp_path):
    fake, calls = _recording_python3(tmp_path)
    run = _run(tmp_path, "checkpoints", "base", path_prefix=str(fake))
    assert run.returncode == 0, run.stderr
    home = tmp_path / "home"
    want = [f"-m deepinfer_sm80.smoke_model {home}/smoke --seed 0"]
    assert calls.read_text().splitlines() == want


def test_unknown_commands_are_refused(tmp_path):
    run = _run(tmp_path, "bogus")
    assert run.returncode == 2 and "unknown command bogus" in run.stderr


def test_collect_lists_each_tests_outcome_from_a_run_cut_short(tmp_path):
    out = tmp_path / "home" / "out"
    out.mkdir(parents=True)
    (out / "tests.log").write_text(
        "test-gpu: tiers gpu\n"
        "tests/ops/test_a.py::test_one PASSED [ 1%]\n"
        "tests/ops/test_a.py::test_two FAILED [ 2%]\n"
        "tests/ops/test_b.py::test_three SKIPPED (why) [ 3%]\n"
    )  # no tests.done: the run was cut short
    dest = tmp_path / "dest"
    dest.mkdir()
    run = _run(tmp_path, "collect", str(dest))
    assert run.returncode == 0, run.stderr
    outcomes = (out / "tests.outcomes").read_text().splitlines()
    assert outcomes == [
        "tests/ops/test_a.py::test_one PASSED [ 1%]",
        "tests/ops/test_a.py::test_two FAILED [ 2%]",
        "tests/ops/test_b.py::test_three SKIPPED (why) [ 3%]",
    ]
    listing = subprocess.run(["tar", "tzf", str(dest / "e2e-results.tar.gz")],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "./tests.outcomes" in listing.split()


def test_wait_with_a_destination_brings_back_the_run_so_far(tmp_path):
    """A remote GPU machine can go away between calls: each wait with DEST collects."""
    out = tmp_path / "home" / "out"
    out.mkdir(parents=True)
    (out / "tests.log").write_text("tests/ops/test_a.py::test_one FAILED [ 50%]\n")
    dest = tmp_path / "dest"  # created by the script
    run = _run(tmp_path, "wait", "tests", "0", str(dest))
    assert run.returncode == 0, run.stderr
    assert "tests still running" in run.stdout
    listing = subprocess.run(["tar", "tzf", str(dest / "e2e-results.tar.gz")],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert {"./tests.outcomes", "./tests.log.tail"} <= set(listing.split())
    run = _run(tmp_path, "wait", "tests", "0")  # without DEST nothing is written
    assert run.returncode == 0 and "e2e-results" not in run.stdout


def test_checkpoints_with_keys_writes_the_base_and_those_controls(tmp_path):
    fake, calls = _recording_python3(tmp_path)
    run = _run(tmp_path, "checkpoints", "L24-50pct", "L39-1pct", path_prefix=str(fake))
    assert run.returncode == 0, run.stderr
    home = tmp_path / "home"
    assert calls.read_text().splitlines() == [
        f"-m deepinfer_sm80.smoke_model {home}/smoke --seed 0",
        f"-m deepinfer_sm80.smoke_model {home}/smoke-perturbed-L39-1pct --seed 0 "
        "--perturb-layer 39 --perturb-rel 0.01",
        f"-m deepinfer_sm80.smoke_model {home}/smoke-perturbed-L24-50pct --seed 0 "
        "--perturb-layer 24 --perturb-rel 0.5",
    ]
    bad = _run(tmp_path, "checkpoints", "L24-2pct", path_prefix=str(fake))
    assert bad.returncode != 0 and "L24-2pct" in bad.stderr


def test_collect_brings_each_wave_record_as_its_own_file(tmp_path):
    """The wave records (a few MB each) come back beside the tarball, not inside it, and
    the JSON record (about 6 MiB of JSON per probe run) stays on the machine."""
    out = tmp_path / "home" / "out"
    out.mkdir(parents=True)
    for name in ("wave-eager.npz", "wave-graphs.npz", "correctness.json"):
        (out / name).write_bytes(b"x")
    dest = tmp_path / "dest"
    fake = tmp_path / "bin"  # `report` is not what this checks: a python3 that does nothing
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\nexit 0\n")
    (fake / "python3").chmod(0o755)
    run = _run(tmp_path, "collect", str(dest), path_prefix=str(fake))
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in dest.iterdir()) == [
        "e2e-results.tar.gz",
        "wave-eager.npz",
        "wave-graphs.npz",
    ]
    listing = subprocess.run(["tar", "tzf", str(dest / "e2e-results.tar.gz")],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert not [n for n in listing.split() if n.endswith((".npz", "correctness.json"))]


def test_aot_folder_becomes_every_later_phases_aot_dir(tmp_path):
    """`aot DIR` keeps a copy; from then on each phase runs with DEEPINFER_AOT_DIR on it
    (the plugin seeds its caches from there); a folder without a manifest is refused."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/sh\necho "aot_dir=${DEEPINFER_AOT_DIR:-none}"\n')
    (fake / "python3").chmod(0o755)
    run = _run(tmp_path, "start", "correctness", path_prefix=str(fake))
    out = tmp_path / "home" / "out"
    assert run.returncode == 0 and _wait_done(out / "correctness.done") == "0"
    assert (out / "correctness.log").read_text() == "aot_dir=none\n"
    bad = tmp_path / "not-aot"
    bad.mkdir()
    run = _run(tmp_path, "aot", str(bad))
    assert run.returncode == 2 and "has no manifest.json" in run.stderr
    src = tmp_path / "kernels"
    (src / "mhc").mkdir(parents=True)
    (src / "manifest.json").write_text("{}")
    run = _run(tmp_path, "aot", str(src))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "home" / "aot" / "mhc").is_dir()
    run = _run(tmp_path, "start", "correctness", path_prefix=str(fake))
    assert run.returncode == 0 and _wait_done(out / "correctness.done") == "0"
    assert (out / "correctness.log").read_text() == f"aot_dir={tmp_path}/home/aot\n"


def test_aot_build_builds_the_proxy_folder_with_the_stack_here(tmp_path, monkeypatch):
    """`aot build` runs the AOT command with this machine's python3 (Triton's cache key
    holds its own build) into the folder later phases use; a failing build exits 1 and
    shows its log."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(
        '#!/bin/sh\necho "$@" > "$E2E_HOME/argv"\n'
        '[ -n "$FAIL" ] && { echo "compile failed"; exit 3; }\n'
        'mkdir -p "$4" && echo "{}" > "$4/manifest.json"\n'
    )
    (fake / "python3").chmod(0o755)
    home = tmp_path / "home"
    run = _run(tmp_path, "aot", "build", path_prefix=str(fake))
    assert run.returncode == 0, run.stderr
    argv = (home / "argv").read_text().split()
    assert argv == ["-m", "deepinfer_sm80.aot", "build", f"{home}/aot", "--arches", "9.0",
                    "--hopper-proxy", "--jobs", "4"]  # fmt: skip
    assert (home / "aot" / "manifest.json").is_file()
    assert f"DEEPINFER_AOT_DIR={home}/aot" in run.stdout
    monkeypatch.setenv("FAIL", "1")
    run = _run(tmp_path, "aot", "build", path_prefix=str(fake))
    assert run.returncode == 1 and "compile failed" in run.stdout


def test_cold_empties_the_compile_caches_and_keeps_the_aot_folder(tmp_path):
    """`cold` before a phase: its servers find no Triton, TileLang or vLLM cache (the
    paths every phase exports), only the AOT folder the image ships."""
    home = tmp_path / "home"
    for sub in ("cache/triton/x", "cache/tilelang/y", "cache/vllm/z", "aot/mhc"):
        (home / sub).mkdir(parents=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(
        '#!/bin/sh\necho "$TRITON_CACHE_DIR $TILELANG_CACHE_DIR $VLLM_CACHE_ROOT"\n'
    )
    (fake / "python3").chmod(0o755)
    run = _run(tmp_path, "cold")
    assert run.returncode == 0 and "caches emptied" in run.stdout
    assert not (home / "cache").exists() and (home / "aot" / "mhc").is_dir()
    run = _run(tmp_path, "start", "speculative", path_prefix=str(fake))
    out = home / "out"
    assert run.returncode == 0 and _wait_done(out / "speculative.done") == "0"
    cache = home / "cache"
    assert (out / "speculative.log").read_text().split() == [
        str(cache / "triton"),
        str(cache / "tilelang"),
        str(cache / "vllm"),
    ]
