"""deepinfer health against a real local HTTP server, including its failure modes."""

import json
import re
import socket
import struct
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
            self.server.health_requests += 1
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


def start_fake_vllm() -> ThreadingHTTPServer:
    """A running ``FakeVllm`` (mode "ok", no API key, no /health request yet); the caller
    shuts it down."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    srv.mode, srv.api_key, srv.health_requests = "ok", None, 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def server():
    srv = start_fake_vllm()
    yield srv
    srv.shutdown()
    srv.server_close()


def _target(srv, **kw):
    return health.Target(base_url=f"http://127.0.0.1:{srv.server_address[1]}", **kw)


def test_ready_on_a_healthy_server(server):
    assert "42" in health.check_ready(_target(server))
    server.mode = "reasoning-only"
    assert "42" in health.check_ready(_target(server))


def test_ready_without_the_known_answer_takes_any_tokens_but_not_none(server):
    server.mode = "wrong-answer"
    assert health.check_ready(_target(server, known_answer=False)) == "41"
    server.mode = "empty"
    with pytest.raises(health.HealthError, match="generated no tokens"):
        health.check_ready(_target(server, known_answer=False))


@pytest.mark.parametrize(
    "mode,stage,message",
    [
        ("503", "health", "HTTP 503"),
        ("wrong-model", "models", "'deepseek-v4.1-flash' is not served"),
        ("empty", "completion", "generated no tokens"),
        ("wrong-answer", "completion", "model output is wrong"),
        ("slow", "completion", "no complete answer within 0.5 s"),
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
    # Not retried: a wrong key does not become right by waiting.
    start = time.monotonic()
    with pytest.raises(health.HealthError) as info:
        health.wait(health.check_ready, _target(server, api_key="sk-wrong"), 30, poll_s=0.1)
    assert time.monotonic() - start < 2
    assert str(info.value) == (
        "models: GET /v1/models answered HTTP 401 (check the API key: VLLM_API_KEY)"
    )


def test_wait_gives_up_at_its_end_and_says_how_long_it_waited(server):
    """Tries at 0, 0.5 and 1.0 s, the last at 1.1 s (MIN_ATTEMPT_S before the end). On a
    loaded machine the third answer can come after 1.1 s, which leaves no room for a
    fourth: the message must count the attempts the server saw, 3 or 4."""
    server.mode = "503"
    start = time.monotonic()
    with pytest.raises(health.HealthError) as info:
        health.wait(health.check_live, _target(server), 1.2, poll_s=0.5)
    took = time.monotonic() - start
    assert 1.1 <= took < 1.5, took
    assert server.health_requests in (3, 4), server.health_requests
    assert re.fullmatch(
        r"health: GET /health answered HTTP 503 \(still failing after waiting 1\.[1-4] s, "
        rf"{server.health_requests} attempts\)",
        str(info.value),
    )


def test_wait_cuts_the_last_attempt_to_its_end(drip_server):
    """A 10 s check deadline inside a 1 s wait: the wait still ends at 1 s, and says the
    attempt had 1 s, not 10."""
    start = time.monotonic()
    with pytest.raises(health.HealthError) as info:
        health.wait(health.check_live, _url_target(drip_server, timeout_s=10), 1.0, poll_s=0.2)
    assert time.monotonic() - start < 1.5
    assert re.fullmatch(
        r"health: GET /health gave no complete answer within 1 s "
        r"\(still failing after waiting 1\.[0-4] s, 1 attempt\)",
        str(info.value),
    )


def test_wait_stops_at_once_on_a_final_failure():
    calls = []

    def check(t, deadline):
        calls.append(deadline)
        raise health.HealthError("container", "container x has exited with code 3", final=True)

    start = time.monotonic()
    with pytest.raises(health.HealthError, match=r"^container: container x has exited") as info:
        health.wait(check, health.Target(), 60, poll_s=0.1)
    assert time.monotonic() - start < 1 and len(calls) == 1
    assert "still failing" not in str(info.value)


class Dripper(BaseHTTPRequestHandler):
    """Answers 200 with a body it sends one byte every 0.3 s: each read is quick, the
    whole answer is not."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        try:
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.3)
        except OSError:
            pass


@pytest.fixture
def drip_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Dripper)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url_target(srv, **kw):
    return health.Target(base_url=f"http://127.0.0.1:{srv.server_address[1]}", **kw)


def test_timeout_is_a_deadline_for_the_whole_check(drip_server):
    start = time.monotonic()
    with pytest.raises(health.HealthError) as info:
        health.check_live(_url_target(drip_server, timeout_s=1))
    took = time.monotonic() - start
    assert 0.9 <= took < 1.5, took
    assert str(info.value) == "health: GET /health gave no complete answer within 1 s"


class RudeServer:
    """A TCP server that reads a request and then closes (or resets) without answering,
    for its first ``misbehave`` connections, then answers like a healthy server."""

    def __init__(self, how: str, misbehave: int = 10**9):
        self.how, self.left = how, misbehave
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    data = conn.recv(65536)
                except OSError:
                    continue
                if not data:  # check_port's bare connect
                    continue
                if self.left > 0:
                    self.left -= 1
                    if self.how == "reset":
                        conn.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    elif self.how == "garbage":
                        conn.sendall(b"not http at all\r\n\r\n")
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

    def close(self):
        self.sock.close()


@pytest.mark.parametrize(
    "how,reason",
    [
        ("close", "the server closed the connection without answering"),
        ("reset", "connection reset by the server"),
        ("garbage", "not an HTTP answer (BadStatusLine)"),
    ],
)
def test_transport_failures_are_health_errors(how, reason):
    rude = RudeServer(how)
    try:
        with pytest.raises(health.HealthError) as info:
            health.check_live(health.Target(base_url=f"http://127.0.0.1:{rude.port}", timeout_s=3))
        assert str(info.value) == f"health: GET /health failed: {reason}"
    finally:
        rude.close()


@pytest.mark.parametrize("how", ["close", "reset", "garbage"])
def test_wait_retries_transport_failures(how):
    rude = RudeServer(how, misbehave=2)
    try:
        target = health.Target(base_url=f"http://127.0.0.1:{rude.port}", timeout_s=3)
        seen = []
        health.wait(
            health.check_live, target, 10, poll_s=0.05, progress=lambda e, x: seen.append(x)
        )
        assert [x.stage for x in seen] == ["health", "health"]
    finally:
        rude.close()


@pytest.mark.parametrize(
    "url,message",
    [
        ("ftp://127.0.0.1:8000", "url: 'ftp://127.0.0.1:8000' is not an http(s)://host:port URL"),
        ("127.0.0.1:8000", "url: '127.0.0.1:8000' is not an http(s)://host:port URL"),
        ("http://127.0.0.1:99999", "url: 'http://127.0.0.1:99999' has an invalid port (1-65535)"),
        ("http://127.0.0.1:0", "url: 'http://127.0.0.1:0' has an invalid port (1-65535)"),
    ],
)
def test_bad_urls_are_named_and_not_retried(url, message, capsys):
    start = time.monotonic()
    assert cli.main(["health", "--url", url, "--wait", "30"]) == 1
    assert capsys.readouterr().err == f"unhealthy: {message}\n"
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--timeout", "0", "argument --timeout: '0': give a number of seconds > 0"),
        ("--timeout", "nan", "argument --timeout: 'nan': give a finite number of seconds >= 0"),
        ("--wait", "-1", "argument --wait: '-1': give a finite number of seconds >= 0"),
        ("--wait", "soon", "argument --wait: 'soon' is not a number of seconds"),
        ("--poll", "inf", "argument --poll: 'inf': give a finite number of seconds >= 0"),
    ],
)
def test_bad_durations_are_refused(flag, value, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["health", flag, value])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"error: {message}")


def test_cli_exit_codes(server, capsys, monkeypatch):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    assert cli.main(["health", "--ready", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == "ready"
    server.mode = "503"
    assert cli.main(["health", "--live", "--url", url]) == 1
    assert "unhealthy: health: GET /health answered HTTP 503" in capsys.readouterr().err
