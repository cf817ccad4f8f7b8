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
