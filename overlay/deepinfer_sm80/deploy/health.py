"""``deepinfer health``: is the server alive, and is it really ready?

- live: the port accepts connections and ``GET /health`` answers 200 (cheap; what compose
  polls).
- ready: also ``GET /v1/models`` lists the served name, and one short chat completion
  (thinking off, temperature 0, a fixed question whose answer is known) returns at least
  one generated token with that answer in its content or reasoning content.

Every check has one total deadline (``Target.timeout_s``) covering all of its requests,
from the connect to the last byte: a server that drips its answer slowly fails at the
deadline instead of holding the check open, since a per-read timeout restarts with every
byte. Every transport failure (refused, reset, dropped, closed early) is a ``HealthError``,
so ``wait`` retries it like any other failed check.

Standard library only (http.client), so it runs in any container or host.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

READY_PROMPT = "What is 6 times 7? Reply with the number only."
READY_ANSWER = "42"
# Bodies of the three endpoints are small; a larger one is not vLLM answering.
MAX_BODY_BYTES = 1 << 20
# The last try of a wait starts this long before its end (time enough to be refused).
MIN_ATTEMPT_S = 0.1


class HealthError(Exception):
    """A failed check; ``stage`` says which one, the message says why. ``final`` marks a
    failure that waiting cannot mend (the server's container has exited)."""

    def __init__(self, stage: str, message: str, final: bool = False) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.message = message
        self.final = final


@dataclass(frozen=True)
class Target:
    base_url: str = "http://127.0.0.1:8000"
    served_model_name: str = "deepseek-v4.1-flash"
    api_key: str | None = None
    # The deadline of one whole check (every request it makes), in seconds.
    timeout_s: float = 10.0
    # False for checkpoints with random weights (`deepinfer smoke-model`): any generated
    # tokens prove the path; the known answer cannot be expected of them.
    known_answer: bool = True


def _endpoint(t: Target) -> tuple[str, str, int, str]:
    u = urlparse(t.base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise HealthError("url", f"{t.base_url!r} is not an http(s)://host:port URL", final=True)
    try:
        port = u.port
    except ValueError:
        port = 0
    if port is None:
        port = 443 if u.scheme == "https" else 80
    if not 0 < port < 65536:
        raise HealthError("url", f"{t.base_url!r} has an invalid port (1-65535)", final=True)
    return u.scheme, u.hostname, port, u.path.rstrip("/")


@dataclass(frozen=True)
class Deadline:
    """When a check must be done by (``time.monotonic()``), and the seconds it was given."""

    at: float
    budget: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def late(self, stage: str, what: str) -> HealthError:
        return HealthError(stage, f"{what} gave no complete answer within {self.budget:.3g} s")


def _transport_reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.RemoteDisconnected):  # (a ConnectionResetError too)
        return "the server closed the connection without answering"
    if isinstance(exc, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(exc, http.client.IncompleteRead):
        return "the server closed the connection in the middle of its answer"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror})"
    if isinstance(exc, http.client.HTTPException):
        return f"not an HTTP answer ({exc.__class__.__name__})"
    return getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__


def _abort(sock: socket.socket) -> None:
    """Called at the deadline from a timer thread: unblocks a read in progress."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _request(
    t: Target, deadline: Deadline, stage: str, method: str, path: str, body: dict | None = None
) -> tuple[int, bytes]:
    scheme, host, port, prefix = _endpoint(t)
    left = deadline.remaining()
    if left <= 0:
        raise deadline.late(stage, f"{method} {path}")
    headers = {"Content-Type": "application/json", "Connection": "close"}
    if t.api_key:
        headers["Authorization"] = f"Bearer {t.api_key}"
    data = None if body is None else json.dumps(body).encode()
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = cls(host, port, timeout=left)
    timer = None
    try:
        conn.connect()
        # The socket timeout bounds each read; the timer bounds them all together. (The
        # response keeps reading from this socket after the connection object lets go.)
        timer = threading.Timer(max(0.0, deadline.remaining()), _abort, args=(conn.sock,))
        timer.daemon = True
        timer.start()
        conn.request(method, prefix + path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read(MAX_BODY_BYTES + 1)
        status = resp.status
    except (OSError, http.client.HTTPException) as exc:
        if deadline.remaining() <= 0.01 or isinstance(exc, TimeoutError):
            raise deadline.late(stage, f"{method} {path}") from None
        raise HealthError(stage, f"{method} {path} failed: {_transport_reason(exc)}") from None
    finally:
        if timer is not None:
            timer.cancel()
        conn.close()
    if deadline.remaining() <= 0:  # the timer cut a read that then looked complete
        raise deadline.late(stage, f"{method} {path}")
    if len(raw) > MAX_BODY_BYTES:
        raise HealthError(stage, f"{method} {path} answered more than {MAX_BODY_BYTES} bytes")
    if status in (401, 403):  # a wrong key stays wrong: waiting longer cannot help
        raise HealthError(
            stage,
            f"{method} {path} answered HTTP {status} (check the API key: VLLM_API_KEY)",
            final=True,
        )
    if status >= 400:
        raise HealthError(stage, f"{method} {path} answered HTTP {status}")
    return status, raw


def _deadline(t: Target, deadline: Deadline | None) -> Deadline:
    return Deadline.after(t.timeout_s) if deadline is None else deadline


def check_port(t: Target, deadline: Deadline | None = None) -> None:
    deadline = _deadline(t, deadline)
    _, host, port, _ = _endpoint(t)
    left = deadline.remaining()
    if left <= 0:
        raise deadline.late("port", f"connecting to {host}:{port}")
    try:
        with socket.create_connection((host, port), timeout=left):
            pass
    except OSError as exc:
        raise HealthError(
            "port", f"{host}:{port} does not accept connections ({_transport_reason(exc)})"
        ) from None


def check_live(t: Target, deadline: Deadline | None = None) -> None:
    deadline = _deadline(t, deadline)
    check_port(t, deadline)
    status, _ = _request(t, deadline, "health", "GET", "/health")
    if status != 200:
        raise HealthError("health", f"GET /health answered HTTP {status}")


def check_ready(t: Target, deadline: Deadline | None = None) -> str:
    """Every live check, then the model list and one real completion; returns its text."""
    deadline = _deadline(t, deadline)
    check_live(t, deadline)
    _, raw = _request(t, deadline, "models", "GET", "/v1/models")
    try:
        names = [m["id"] for m in json.loads(raw)["data"]]
    except (ValueError, KeyError, TypeError):
        raise HealthError("models", "GET /v1/models did not return an OpenAI model list") from None
    if t.served_model_name not in names:
        raise HealthError(
            "models",
            f"{t.served_model_name!r} is not served (served: {names}); "
            "check served_model_name in the topology",
        )
    body = {
        "model": t.served_model_name,
        "messages": [{"role": "user", "content": READY_PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
        "chat_template_kwargs": {"thinking": False},
    }
    _, raw = _request(t, deadline, "completion", "POST", "/v1/chat/completions", body)
    try:
        reply = json.loads(raw)
        message = reply["choices"][0]["message"]
        tokens = int(reply.get("usage", {}).get("completion_tokens", 0))
        text = (message.get("content") or "") + (message.get("reasoning_content") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise HealthError("completion", "the chat completion is not an OpenAI response") from None
    if tokens < 1:
        raise HealthError("completion", "the model generated no tokens")
    if t.known_answer and not text.strip():
        raise HealthError("completion", "the model generated no text")
    if t.known_answer and READY_ANSWER not in text:
        raise HealthError(
            "completion",
            f"asked {READY_PROMPT!r}, got {text.strip()[:80]!r}: "
            "the server answers but the model output is wrong",
        )
    return text


def check_worker(proc: str = "/proc") -> list[int]:
    """A headless node serves no HTTP: alive means a `vllm` process runs here (same PID
    namespace as the container). Returns their PIDs."""
    import os

    pids = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(os.path.basename(a) == b"vllm" for a in argv[:2]) and b"serve" in argv:
            pids.append(int(entry))
    if not pids:
        raise HealthError("worker", "no `vllm serve` process on this node")
    return sorted(pids)


def wait(check, t: Target, wait_s: float, poll_s: float = 5.0, progress=None):
    """Retry ``check`` until it passes or ``wait_s`` seconds have passed, and no longer:
    each attempt's deadline is cut to the end of the wait, and the last one starts
    ``MIN_ATTEMPT_S`` before that end. A ``final`` failure ends the wait at once.
    ``progress`` (optional) receives ``(elapsed_s, error)`` after each failed attempt
    that is retried."""
    start = time.monotonic()
    end = start + wait_s
    attempts = 0
    while True:
        attempts += 1
        try:
            now = time.monotonic()
            return check(t, Deadline.after(min(t.timeout_s, end - now)))
        except HealthError as exc:
            if exc.final:
                raise
            now = time.monotonic()
            if end - now <= MIN_ATTEMPT_S:
                raise HealthError(
                    exc.stage,
                    f"{exc.message} (still failing after waiting {now - start:.1f} s, "
                    f"{attempts} attempt{'s' if attempts > 1 else ''})",
                ) from None
            if progress is not None:
                progress(now - start, exc)
            # The last try starts early enough to get MIN_ATTEMPT_S of its own.
            time.sleep(min(poll_s, end - now - MIN_ATTEMPT_S))
