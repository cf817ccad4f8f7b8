"""The image tier: the server that `docker compose up` starts is reachable through its
published port, from the host and the way Prometheus and the router connect.

The container runs as compose.yaml ships it (launcher, rendered `vllm serve` argv,
listen address), without GPUs, with a stand-in for vLLM (tests/image/standin/vllm) that
binds exactly the --host and --port the launcher renders. A server that listens on the
container's loopback is unreachable from every one of those places, and this fails.
Needs a Docker engine and the image ``$IMAGE``; a missing one fails rather than skips.
"""

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("IMAGE", "deepinfer-sm80:0.33.0")
PROJECT = "deepinfer-reachtest"
COMPOSE = ["docker", "compose", "-p", PROJECT, "-f", "compose.yaml", "-f", "compose.test.yaml",
           "-f", "tests/image/compose.standin.yaml"]  # fmt: skip
START_S = 90  # the launcher validates, renders and execs the stand-in in a few seconds


def _run(argv, env=None, timeout=300):
    full_env = {**os.environ, "IMAGE": IMAGE, **(env or {})}
    return subprocess.run(
        argv, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


@pytest.fixture(scope="module")
def server():
    if shutil.which("docker") is None:
        pytest.fail("docker CLI not found: the image tier needs a Docker engine")
    if _run(["docker", "info"]).returncode != 0:
        pytest.fail("no Docker engine answers")
    if _run(["docker", "image", "inspect", IMAGE]).returncode != 0:
        pytest.fail(f"image {IMAGE} not built: run `make image`")
    port = _free_port()
    env = {"TOPOLOGY": "tp8", "GPU_COUNT": "1", "PORT": str(port)}
    up = _run([*COMPOSE, "up", "-d", "--no-build", "deepinfer"], env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        deadline, last = time.monotonic() + START_S, "nothing tried"
        while time.monotonic() < deadline:
            try:
                _get(f"http://127.0.0.1:{port}/health")
                break
            except (OSError, urllib.error.URLError) as exc:
                last = repr(exc)
                time.sleep(1)
        else:
            logs = _run([*COMPOSE, "logs", "deepinfer"], env=env)
            pytest.fail(
                f"http://127.0.0.1:{port}/health unreachable from the host for {START_S} s "
                f"({last}); container log:\n{logs.stdout}{logs.stderr}"
            )
        yield port
    finally:
        _run([*COMPOSE, "down", "--volumes", "--remove-orphans"], env=env)


def test_published_port_reaches_the_server_from_the_host(server):
    status, body = _get(f"http://127.0.0.1:{server}/v1/models")
    assert status == 200 and '"deepseek-v4.1-flash"' in body


def test_prometheus_reaches_the_server_by_its_service_name(server):
    """Prometheus scrapes deepinfer:8000 over the compose network (prometheus.yml)."""
    probe = (
        "import urllib.request; "
        "print(urllib.request.urlopen('http://deepinfer:8000/metrics', timeout=5).read().decode())"
    )
    out = _run(["docker", "run", "--rm", "--network", f"{PROJECT}_default", "--entrypoint",
                "python", IMAGE, "-c", probe])  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "vllm:num_requests_running" in out.stdout


def test_router_reaches_the_server_through_the_host_network(server):
    """The router runs with network_mode: host and proxies to 127.0.0.1:PORT."""
    probe = (
        "import urllib.request; "
        f"print(urllib.request.urlopen('http://127.0.0.1:{server}/health', timeout=5).status)"
    )
    out = _run(["docker", "run", "--rm", "--network", "host", "--entrypoint", "python", IMAGE,
                "-c", probe])  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "200"
