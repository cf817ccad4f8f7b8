"""``deepinfer health``: is the server alive, and is it really ready?

- live: the port accepts connections and ``GET /health`` answers 200 (cheap; what compose
  polls).
- ready: also ``GET /v1/models`` lists the served name, and one short chat completion
  (thinking off, temperature 0, a fixed question whose answer is known) returns at least
  one generated token with that answer in its content or reasoning content.

Standard library only (urllib), so it runs in any container or host.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlparse

READY_PROMPT = "What is 6 times 7? Reply with the number only."
READY_ANSWER = "42"


class HealthError(Exception):
    """A failed check; ``stage`` says which one, the message says why."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage


@dataclass(frozen=True)
class Target:
    base_url: str = "http://127.0.0.1:8000"
    served_model_name: str = "deepseek-v4.1-flash"
    api_key: str | None = None
    timeout_s: float = 10.0


def _request(t: Target, stage: str, method: str, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(t.base_url.rstrip("/") + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if t.api_key:
        req.add_header("Authorization", f"Bearer {t.api_key}")
    try:
        with urllib.request.urlopen(req, timeout=t.timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        hint = " (check the API key: VLLM_API_KEY)" if exc.code in (401, 403) else ""
        raise HealthError(stage, f"{method} {path} answered HTTP {exc.code}{hint}") from None
    except TimeoutError:
        raise HealthError(
            stage, f"{method} {path} gave no answer within {t.timeout_s:g} s"
        ) from None
    except urllib.error.URLError as exc:
        raise HealthError(stage, f"{method} {path} failed: {exc.reason}") from None


def check_port(t: Target) -> None:
    u = urlparse(t.base_url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname, port), timeout=t.timeout_s):
            pass
    except OSError as exc:
        raise HealthError(
            "port", f"{u.hostname}:{port} does not accept connections ({exc})"
        ) from None


def check_live(t: Target) -> None:
    check_port(t)
    status, _ = _request(t, "health", "GET", "/health")
    if status != 200:
        raise HealthError("health", f"GET /health answered HTTP {status}")


def check_ready(t: Target) -> str:
    """Every live check, then the model list and one real completion; returns its text."""
    check_live(t)
    _, raw = _request(t, "models", "GET", "/v1/models")
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
    _, raw = _request(t, "completion", "POST", "/v1/chat/completions", body)
    try:
        reply = json.loads(raw)
        message = reply["choices"][0]["message"]
        tokens = int(reply.get("usage", {}).get("completion_tokens", 0))
    except (ValueError, KeyError, IndexError, TypeError):
        raise HealthError("completion", "the chat completion is not an OpenAI response") from None
    text = (message.get("content") or "") + (message.get("reasoning_content") or "")
    if tokens < 1 or not text.strip():
        raise HealthError("completion", "the model generated no tokens")
    if READY_ANSWER not in text:
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


def wait(check, t: Target, deadline_s: float, poll_s: float = 5.0, container=None):
    """Retry ``check`` until it passes or ``deadline_s`` passes. ``container`` (a callable
    returning None while running, else a failure message) stops the wait at once when
    the server's container has exited."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return check(t)
        except HealthError as exc:
            if container is not None:
                dead = container()
                if dead:
                    raise HealthError("container", dead) from None
            if time.monotonic() + poll_s > end:
                raise HealthError(
                    exc.stage, f"{exc} (still failing after {deadline_s:g} s)"
                ) from None
            time.sleep(poll_s)


def docker_container_probe(name: str, log_lines: int = 40):
    """A ``container`` callable for ``wait``: the docker SDK, imported only when asked."""
    try:
        import docker
    except ImportError:
        raise HealthError(
            "container", "--container needs the docker SDK (pip install docker)"
        ) from None
    client = docker.from_env()

    def probe() -> str | None:
        try:
            c = client.containers.get(name)
        except docker.errors.NotFound:
            return f"container {name!r} does not exist"
        c.reload()
        if c.status in ("exited", "dead"):
            tail = c.logs(tail=log_lines).decode(errors="replace")
            return f"container {name!r} has {c.status}; its last log lines:\n{tail}"
        return None

    return probe
