"""The compose files as data (no Docker engine needed): where the server listens inside
its container and what the host exposes. The image tier checks the same from outside."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


def test_server_listens_on_the_container_interface_and_is_published_on_loopback():
    svc = _compose("compose.yaml")["services"]["deepinfer"]
    assert svc["environment"]["DEEPINFER_LISTEN_HOST"] == "0.0.0.0"
    assert svc["ports"] == ["${BIND_ADDRESS:-127.0.0.1}:${PORT:-8000}:8000"]


def test_multinode_listens_where_bind_address_says_on_the_host_network():
    svc = _compose("compose.multinode.yaml")["services"]["deepinfer"]
    assert svc["network_mode"] == "host"
    assert svc["environment"]["DEEPINFER_LISTEN_HOST"] == "${BIND_ADDRESS:-127.0.0.1}"


def test_exposure_settings_reach_the_launcher_and_the_router():
    services = _compose("compose.yaml")["services"]
    env = services["deepinfer"]["environment"]
    assert env["DEEPINFER_PUBLISHED_HOST"] == "${BIND_ADDRESS:-127.0.0.1}"
    assert env["DEEPINFER_ALLOW_UNAUTHENTICATED"] == "${DEEPINFER_ALLOW_UNAUTHENTICATED:-0}"
    router = services["router"]
    assert router["environment"]["ROUTER_BIND_ADDRESS"] == "${BIND_ADDRESS:-127.0.0.1}"
    assert router["entrypoint"] == ["/bin/sh", "/usr/local/bin/check-exposure.sh"]
    assert "ROUTER_BIND_ADDRESS" in router["environment"]["NGINX_ENVSUBST_FILTER"]


@pytest.mark.parametrize(
    ("name", "check", "server"),
    [("compose.yaml", "deepinfer-check", "deepinfer"), ("compose.yaml", "router-check", "router"),
     ("compose.multinode.yaml", "deepinfer-check", "deepinfer")],
)  # fmt: skip
def test_a_refusal_stops_once_and_a_crash_restarts(name, check, server):
    """Docker restarts by policy, not by exit code: the refusals (exit 2 and 3) happen in a
    one-shot service that never restarts, and the server starts only when it passed."""
    services = _compose(name)["services"]
    assert services[check]["restart"] == "no"
    assert services[server]["restart"] == "unless-stopped"
    assert services[server]["depends_on"] == {
        check: {"condition": "service_completed_successfully"}
    }
    if check == "deepinfer-check":
        assert services[check]["entrypoint"][-2:] == ["launch", "--check"]
        assert services[check]["command"] == services[server]["command"]
        # Same image, settings, mounts and GPUs as the server it vouches for.
        for key in ("image", "environment", "volumes", "deploy", "ipc"):
            assert services[check][key] == services[server][key], key


# Where a server compiles kernels in its container: the image's TRITON_CACHE_DIR,
# TILELANG_CACHE_DIR and VLLM_CACHE_ROOT, and FlashInfer's JIT folder under HOME
# (flashinfer.jit.env: $HOME/.cache/flashinfer).
COMPILE_CACHES = {
    "triton-cache": "/home/deepinfer/.cache/triton",
    "tilelang-cache": "/home/deepinfer/.cache/tilelang",
    "vllm-cache": "/home/deepinfer/.cache/vllm",
    "flashinfer-cache": "/home/deepinfer/.cache/flashinfer",
}


@pytest.mark.parametrize("name", ["compose.yaml", "compose.multinode.yaml"])
def test_every_compile_cache_survives_a_new_container(name):
    """Each compile cache is a named volume of the server (so `make down && make up` skips
    the compiles), at a folder the image creates for its user (a volume mounted where the
    image has no folder comes up owned by root, and the server could not write it)."""
    compose = _compose(name)
    mounts = compose["services"]["deepinfer"]["volumes"]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    created = dockerfile.split("mkdir -p", 1)[1].split("&&", 1)[0].split()
    for volume, folder in COMPILE_CACHES.items():
        assert f"{volume}:{folder}" in mounts, (volume, mounts)
        assert volume in compose["volumes"]
        assert folder in created, (folder, created)
    env = {
        k: v
        for line in dockerfile.split("ENV HOME=", 1)[1].split("USER", 1)[0].splitlines()
        for k, _, v in [line.strip(" \\").partition("=")]
    }
    assert env["TRITON_CACHE_DIR"] == COMPILE_CACHES["triton-cache"]
    assert env["TILELANG_CACHE_DIR"] == COMPILE_CACHES["tilelang-cache"]
    assert env["VLLM_CACHE_ROOT"] == COMPILE_CACHES["vllm-cache"]
    assert "FLASHINFER_WORKSPACE_BASE" not in dockerfile  # FlashInfer's folder follows HOME
