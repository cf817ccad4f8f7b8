"""The Makefile's inputs: TOPOLOGY (from the command line, the environment or .env), GPU
and NODE_ENV reach shell commands, so only plain names pass, checked before make or a
shell expands them; `make plan` runs from the light host install (.venv-cli)."""

import importlib.metadata
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["$(shell touch {canary})", "x;touch {canary}", "`touch {canary}`", "a b", "",
           "$$(touch {canary})", "../../etc/passwd", "-x", "x'y", 'x"y',
           "x|touch {canary}"]  # fmt: skip


def _make(tmp_path, *args, env=None, cwd=ROOT):
    full = {k: v for k, v in os.environ.items() if k not in ("TOPOLOGY", "GPU", "NODE_ENV")}
    return subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), *args], cwd=cwd,
                          env={**full, **(env or {})}, capture_output=True, text=True,
                          timeout=30)  # fmt: skip


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
