"""deepinfer health against a real local HTTP server, including its failure modes."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deepinfer_sm80.deploy import cli, health


class FakeVllm(BaseHTTPRequestHandler):
    """Answers like vLLM's OpenAI server; ``mode`` on the server picks a failure."""

    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, code, payload):
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self):
        key = self.server.api_key
        return key is None or self.headers.get("Authorization") == f"Bearer {key}"

    def do_GET(self):
        mode = self.server.mode
        if self.path == "/health":
            return self._send(503 if mode == "503" else 200, {})
        if not self._authorized():
            return self._send(401, {"error": "unauthorized"})
        if self.path == "/v1/models":
            name = "other-model" if mode == "wrong-model" else "deepseek-v4.1-flash"
            return self._send(200, {"object": "list", "data": [{"id": name}]})
        self._send(404, {})

    def do_POST(self):
        mode = self.server.mode
        if not self._authorized():
            return self._send(401, {"error": "unauthorized"})
        length = int(self.headers["Content-Length"])
        request = json.loads(self.rfile.read(length))
        assert request["chat_template_kwargs"] == {"thinking": False}
        if mode == "slow":
            time.sleep(2)
        content = {"empty": "", "wrong-answer": "41"}.get(mode, "42")
        tokens = 0 if mode == "empty" else 2
        reasoning = "6 x 7 = 42" if mode == "reasoning-only" else None
        if mode == "reasoning-only":
            content = None
        self._send(200, {
            "choices": [{"message": {"role": "assistant", "content": content,
                                     "reasoning_content": reasoning}}],
            "usage": {"completion_tokens": tokens},
        })  # fmt: skip


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    srv.mode, srv.api_key = "ok", None
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _target(srv, **kw):
    return health.Target(base_url=f"http://127.0.0.1:{srv.server_address[1]}", **kw)


def test_ready_on_a_healthy_server(server):
    assert "42" in health.check_ready(_target(server))
    server.mode = "reasoning-only"
    assert "42" in health.check_ready(_target(server))


@pytest.mark.parametrize(
    "mode,stage,message",
    [
        ("503", "health", "HTTP 503"),
        ("wrong-model", "models", "'deepseek-v4.1-flash' is not served"),
        ("empty", "completion", "generated no tokens"),
        ("wrong-answer", "completion", "model output is wrong"),
        ("slow", "completion", "no answer within 0.5 s"),
    ],
)
def test_ready_failures_name_the_stage(server, mode, stage, message):
    server.mode = mode
    with pytest.raises(health.HealthError, match=message) as info:
        health.check_ready(_target(server, timeout_s=0.5))
    assert info.value.stage == stage


def test_refused_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens
    with pytest.raises(health.HealthError, match="does not accept connections") as info:
        health.check_live(health.Target(base_url=f"http://127.0.0.1:{port}", timeout_s=1))
    assert info.value.stage == "port"


def test_api_key(server):
    server.api_key = "sk-test"
    with pytest.raises(health.HealthError, match=r"HTTP 401 \(check the API key"):
        health.check_ready(_target(server))
    assert health.check_ready(_target(server, api_key="sk-test"))


def test_wait_retries_then_fails_fast_on_a_dead_container(server):
    server.mode = "503"
    with pytest.raises(health.HealthError, match=r"still failing after 0\.3 s"):
        health.wait(health.check_live, _target(server), 0.3, poll_s=0.1)
    with pytest.raises(health.HealthError, match="has exited; its last log lines"):
        health.wait(
            health.check_live,
            _target(server),
            60,
            poll_s=0.1,
            container=lambda: "container 'x' has exited; its last log lines:\nboom",
        )


def test_cli_exit_codes(server, capsys, monkeypatch):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    assert cli.main(["health", "--ready", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == "ready"
    server.mode = "503"
    assert cli.main(["health", "--live", "--url", url]) == 1
    assert "unhealthy: health: GET /health answered HTTP 503" in capsys.readouterr().err
