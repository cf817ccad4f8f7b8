"""Exposure policy: beyond loopback the server and the router refuse to start without
VLLM_API_KEY unless DEEPINFER_ALLOW_UNAUTHENTICATED=1; secrets files stay out of git and
out of the image."""

import os
import subprocess
from pathlib import Path

import pytest

from deepinfer_sm80.deploy import cli, exposure

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "configs" / "router" / "check-exposure.sh"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.1.1", True), ("localhost", True), ("::1", True),
     ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.0.0.1", False),
     ("example.com", False), ("", False)],
)  # fmt: skip
def test_is_loopback(host, loopback):
    assert exposure.is_loopback(host) is loopback


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("VLLM_API_KEY", exposure.ALLOW_ENV, exposure.PUBLISHED_ENV,
                "DEEPINFER_LISTEN_HOST"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_published_beyond_loopback_without_a_key_is_refused(capsys, clean_env):
    clean_env.setenv("DEEPINFER_LISTEN_HOST", "0.0.0.0")
    clean_env.setenv(exposure.PUBLISHED_ENV, "0.0.0.0")
    assert cli.main(["launch", "tp8", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert "refused before launch: the server would be reachable at 0.0.0.0 without an API " \
        "key: set VLLM_API_KEY" in captured.err  # fmt: skip
    assert f"{exposure.ALLOW_ENV}=1" in captured.err and "vllm serve" not in captured.out


def test_container_side_bind_alone_is_not_exposure(capsys, clean_env):
    """compose.yaml listens on 0.0.0.0 in the container but publishes on loopback."""
    clean_env.setenv("DEEPINFER_LISTEN_HOST", "0.0.0.0")
    clean_env.setenv(exposure.PUBLISHED_ENV, "127.0.0.1")
    assert cli.main(["launch", "tp8", "--dry-run"]) == 0
    assert "--host 0.0.0.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("env", "code"),
    [({"VLLM_API_KEY": "s3cret"}, 0), ({exposure.ALLOW_ENV: "1"}, 0),
     ({exposure.ALLOW_ENV: "0"}, 2), ({"VLLM_API_KEY": "  "}, 2)],
)  # fmt: skip
def test_a_key_or_the_explicit_setting_allows_it(capsys, clean_env, env, code):
    clean_env.setenv("DEEPINFER_LISTEN_HOST", "10.0.0.5")  # no container: listen = exposure
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert cli.main(["launch", "tp8", "--dry-run"]) == code
    assert "s3cret" not in capsys.readouterr().out  # the key never reaches argv


def test_a_vague_allow_value_is_refused(capsys, clean_env):
    clean_env.setenv(exposure.ALLOW_ENV, "yes")
    assert cli.main(["launch", "tp8", "--dry-run"]) == 2
    assert f"{exposure.ALLOW_ENV}='yes': use 1 (allow) or 0" in capsys.readouterr().err


def _guard(env: dict) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"]}
    return subprocess.run(["sh", str(GUARD), "echo", "nginx-started"], env={**base, **env},
                          capture_output=True, text=True, timeout=10)  # fmt: skip


@pytest.mark.parametrize(
    ("env", "starts"),
    [({}, True), ({"ROUTER_BIND_ADDRESS": "127.0.0.1"}, True),
     ({"ROUTER_BIND_ADDRESS": "0.0.0.0"}, False),
     ({"ROUTER_BIND_ADDRESS": "0.0.0.0", "VLLM_API_KEY": "k"}, True),
     ({"ROUTER_BIND_ADDRESS": "10.1.2.3", "DEEPINFER_ALLOW_UNAUTHENTICATED": "1"}, True),
     ({"ROUTER_BIND_ADDRESS": "10.1.2.3", "DEEPINFER_ALLOW_UNAUTHENTICATED": "true"}, False)],
)  # fmt: skip
def test_router_binds_like_the_server(env, starts):
    out = _guard(env)
    if starts:
        assert out.returncode == 0 and out.stdout.strip() == "nginx-started", out.stderr
    else:
        assert out.returncode == 2 and not out.stdout
        assert out.stderr.startswith("error: router: ")


def test_router_listens_on_the_bind_address():
    template = (ROOT / "configs" / "router" / "nginx.conf.template").read_text()
    assert "listen ${ROUTER_BIND_ADDRESS}:${ROUTER_PORT};" in template


@pytest.mark.parametrize("name", [".env", "node0.env", "configs/nodes/node1.env"])
def test_env_files_are_ignored_by_git_and_docker(name):
    out = subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT, check=False)
    assert out.returncode == 0, f"{name} is not git-ignored"
    docker = (ROOT / ".dockerignore").read_text().split()
    assert "**/.env" in docker and "**/*.env" in docker
    example = subprocess.run(["git", "check-ignore", "-q", ".env.example"], cwd=ROOT)
    assert example.returncode == 1, ".env.example must stay tracked"
