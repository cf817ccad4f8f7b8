"""The Makefile's inputs: TOPOLOGY (from the command line, the environment or .env), GPU
and NODE_ENV reach shell commands, so only plain names pass, checked before make or a
shell expands them; `make plan` runs from the light host install (.venv-cli); the GPUs
`make up` reserves come from the host-side `deepinfer gpus`, asked only by the targets
that reserve GPUs."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepinfer_sm80.deploy.config_files import CONFIG_DIR
from deepinfer_sm80.deploy.topology import load

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["$(shell touch {canary})", "x;touch {canary}", "`touch {canary}`", "a b", "",
           "$$(touch {canary})", "../../etc/passwd", "-x", "x'y", 'x"y',
           "x|touch {canary}"]  # fmt: skip


MAKE_VARS = ("TOPOLOGY", "GPU", "NODE_ENV", "GPU_COUNT", "MAKEFLAGS", "MAKELEVEL")


def _make(tmp_path, *args, env=None, cwd=ROOT, dry_run=True):
    full = {k: v for k, v in os.environ.items() if k not in MAKE_VARS}
    flags = ["-n"] if dry_run else ["-s", "--no-print-directory"]
    return subprocess.run(["make", *flags, "-f", str(ROOT / "Makefile"), *args], cwd=cwd,
                          env={**full, **(env or {})}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.mark.parametrize("how", ["argument", "environment", "dotenv"])
@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_topology_is_refused_before_any_shell(tmp_path, how, value):
    canary = tmp_path / "canary"
    value = value.format(canary=canary)
    if how == "argument":
        out = _make(tmp_path, "plan", f"TOPOLOGY={value}")
    elif how == "environment":
        out = _make(tmp_path, "plan", env={"TOPOLOGY": value})
    else:  # a checkout whose .env holds the line
        (tmp_path / ".env").write_text(f"TOPOLOGY={value}\n")
        for name in ("configs", "requirements", "overlay"):
            (tmp_path / name).symlink_to(ROOT / name)
        out = _make(tmp_path, "plan", cwd=tmp_path)
    if how == "dotenv" and value == "":
        assert out.returncode == 0 and "plan tp2-pp3" in out.stdout  # empty line: the default
        return
    assert out.returncode == 2, out.stdout
    assert "TOPOLOGY must be a topology name" in out.stderr
    assert not canary.exists()


@pytest.mark.parametrize(("var", "value"), [("GPU", "a;touch {canary}"),
                                            ("NODE_ENV", "x$(shell touch {canary})")])  # fmt: skip
def test_gpu_and_node_env_are_checked_too(tmp_path, var, value):
    canary = tmp_path / "canary"
    out = _make(tmp_path, "up-node", f"{var}={value.format(canary=canary)}")
    assert out.returncode == 2 and f"{var} must be" in out.stderr and not canary.exists()


def test_plain_names_pass_and_plan_uses_the_light_install(tmp_path):
    # -W: as if requirements/cli.txt had changed, so the install's recipe shows too.
    out = _make(tmp_path, "-W", "requirements/cli.txt", "plan", "TOPOLOGY=tp8",
                "GPU=A100-SXM4-80GB")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert ".venv-cli/bin/deepinfer plan tp8 --gpu A100-SXM4-80GB" in out.stdout
    assert "requirements/test.txt" not in out.stdout  # not the 10 GB environment
    assert "pip install --quiet -r requirements/cli.txt" in out.stdout


@pytest.mark.vllm
def test_cli_pins_match_the_vllm_environment():
    """The light install validates like the image: same pydantic and PyYAML (and the Docker
    SDK, which requirements/test.txt takes from the same host.txt)."""
    files, pins = [ROOT / "requirements" / "cli.txt"], []
    while files:
        for line in files.pop().read_text().splitlines():
            if line.startswith("-r "):
                files.append(ROOT / "requirements" / line.split()[1])
            elif line and not line.startswith("#"):
                pins.append(line.split("=="))
    assert "docker" in {name for name, _ in pins}
    for name, version in pins:
        assert importlib.metadata.version(name) == version, name


# ------------------------------------------------------------------ GPU_COUNT


def _checkout(tmp_path: Path, *clis: str, count: dict | None = None) -> Path:
    """A checkout whose host-side deepinfer(s) (``.venv-cli``, ``.venv``) are stand-ins
    that log each call and print a GPU count telling them apart."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("configs", "requirements", "overlay"):
        (root / name).symlink_to(ROOT / name)
    for venv in clis:
        exe = root / venv / "bin" / "deepinfer"
        exe.parent.mkdir(parents=True)
        n = (count or {}).get(venv, {".venv-cli": 7, ".venv": 5}[venv])
        exe.write_text(f'#!/bin/sh\necho "{venv} $*" >> "{root}/calls"\necho {n}\n')
        exe.chmod(0o755)
    return root


def _calls(root: Path) -> list[str]:
    f = root / "calls"
    return f.read_text().splitlines() if f.exists() else []


@pytest.mark.parametrize("clis", [(), (".venv-cli",), (".venv",)], ids=["none", "cli", "venv"])
@pytest.mark.parametrize("target", ["help", "lint", "plan", "down", "logs", "up-node"])
def test_targets_that_reserve_no_gpus_never_ask_for_the_count(tmp_path, clis, target):
    """`make help` and the rest work with or without a host-side deepinfer, and call none."""
    root = _checkout(tmp_path, *clis)
    args = [target, "NODE_ENV=configs/nodes/node1.env.example"] if target == "up-node" else [
        target]  # fmt: skip
    out = _make(tmp_path, *args, cwd=root, dry_run=target != "help")
    assert out.returncode == 0, out.stderr
    assert _calls(root) == []
    assert "GPU count" not in out.stderr


@pytest.mark.parametrize("target", ["down", "logs", "monitoring"])
def test_compose_targets_that_reserve_no_gpus_run_without_the_count(tmp_path, target):
    """Run for real (compose replaced by `true`): no variable make exports asks for it."""
    root = _checkout(tmp_path, ".venv-cli")
    out = _make(tmp_path, target, "COMPOSE=true", cwd=root, dry_run=False)
    assert out.returncode == 0, out.stderr
    assert _calls(root) == []


@pytest.mark.parametrize(
    ("clis", "used", "count"),
    [((".venv-cli",), ".venv-cli", "7"), ((".venv",), ".venv", "5"),
     ((".venv-cli", ".venv"), ".venv-cli", "7")],
    ids=["light-install", "test-venv", "both"],
)  # fmt: skip
def test_up_reserves_the_count_deepinfer_gives_asking_once(tmp_path, clis, used, count):
    root = _checkout(tmp_path, *clis)
    out = _make(tmp_path, "up", "TOPOLOGY=tp8", cwd=root)
    assert out.returncode == 0, out.stderr
    assert f"GPU_COUNT={count} docker compose up -d" in out.stdout
    assert f"starting tp8 on {count} GPUs" in out.stdout
    assert "pip install" not in out.stdout  # an existing install is used, none is built
    assert _calls(root) == [f"{used} gpus tp8"]  # once, however often the recipe names it


def test_weights_and_print_gpu_count_use_it_too(tmp_path):
    root = _checkout(tmp_path, ".venv-cli")
    out = _make(tmp_path, "weights", "TOPOLOGY=smoke", cwd=root)
    assert out.returncode == 0, out.stderr
    assert "GPU_COUNT=7 docker compose run --rm --entrypoint deepinfer deepinfer weights" in (
        out.stdout)  # fmt: skip
    out = _make(tmp_path, "print-gpu-count", "TOPOLOGY=pp6", cwd=root, dry_run=False)
    assert (out.returncode, out.stdout) == (0, "7\n"), out.stderr
    assert _calls(root) == [".venv-cli gpus smoke", ".venv-cli gpus pp6"]


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_given_gpu_count_is_used_as_is(tmp_path, how):
    root = _checkout(tmp_path, ".venv-cli")
    if how == "argument":
        out = _make(tmp_path, "up", "GPU_COUNT=3", cwd=root)
    else:
        out = _make(tmp_path, "up", env={"GPU_COUNT": "3"}, cwd=root)
    assert out.returncode == 0 and "GPU_COUNT=3 docker compose up -d" in out.stdout
    assert _calls(root) == []


def test_without_a_host_side_deepinfer_up_builds_the_light_one_or_says_why(tmp_path):
    root = _checkout(tmp_path)
    out = _make(tmp_path, "up", cwd=root)  # dry run: the install is shown, not made
    assert "pip install --quiet -r requirements/cli.txt" in out.stdout
    assert out.returncode == 2 and "docker compose up" not in out.stdout
    assert ".venv-cli/bin/deepinfer is missing: `make cli` installs it" in out.stderr
    assert "no GPU count for TOPOLOGY=tp2-pp3" in out.stderr and "GPU_COUNT=N" in out.stderr


def test_a_topology_deepinfer_refuses_stops_make(tmp_path):
    root = _checkout(tmp_path, ".venv-cli", count={".venv-cli": ""})
    out = _make(tmp_path, "up", "TOPOLOGY=tp9", cwd=root)
    assert out.returncode == 2 and "docker compose up" not in out.stdout
    assert "no GPU count for TOPOLOGY=tp9 (the reason is above)" in out.stderr


def test_print_gpu_count_with_the_real_cli_for_every_shipped_topology(tmp_path):
    """End to end: make -> the host-side deepinfer -> the topology file."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("configs", "requirements", "overlay"):
        (root / name).symlink_to(ROOT / name)
    exe = root / ".venv" / "bin" / "deepinfer"
    exe.parent.mkdir(parents=True)
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT / "overlay"}" exec "{sys.executable}" '
                   '-m deepinfer_sm80.deploy.cli "$@"\n')  # fmt: skip
    exe.chmod(0o755)
    for path in sorted((CONFIG_DIR / "topologies").glob("*.yaml")):
        out = _make(tmp_path, "print-gpu-count", f"TOPOLOGY={path.stem}", cwd=root,
                    env={"DEEPINFER_CONFIG_DIR": str(CONFIG_DIR)}, dry_run=False)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"{load(str(path))[0].gpus.count}\n", path.name


def test_gpu_tier_leaves_out_the_image_and_the_host_clis_tests(tmp_path):
    """tests/image needs Docker and tests/deploy the host CLI's requirements (the Docker
    SDK): a GPU machine's stack has neither, and neither holds a GPU test."""
    out = _make(tmp_path, "test-gpu", "PYTHON=python3").stdout
    assert "--ignore=tests/image --ignore=tests/deploy" in out, out
    gpu_tests = subprocess.run(["grep", "-rlE", "mark" + r"\.gpu", "tests/deploy", "tests/image"],
                               cwd=ROOT, capture_output=True, text=True).stdout  # fmt: skip
    assert gpu_tests == "", gpu_tests


@pytest.mark.parametrize("target", ["test-gpu", "test-oracles", "e2e", "bench", "charts"])
def test_gpu_targets_put_the_overlay_first_and_keep_the_callers_pythonpath(tmp_path, target):
    """An unpacked stack (vLLM, torch, ...) on PYTHONPATH must survive into the run."""
    out = _make(tmp_path, target, env={"PYTHONPATH": "/stack/site"}).stdout
    assert "PYTHONPATH=overlay:.:${PYTHONPATH:-}" in out, out
