"""A small HTTP client for OpenAI-compatible servers (standard library only).

One connection per request (``http.client``), opened before the clock starts, so TTFT
covers writing the request, the server's queue and prefill, and the first event's way back,
but not the TCP handshake. Streams are read with ``read1`` (whatever bytes have arrived,
chunked transfer decoded) and every event is stamped with ``time.perf_counter()`` when the
bytes holding it arrive. Concurrency is by threads; the GIL is released while a thread
waits on its socket, which is nearly all the time.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse

from benchmarks.serving.sse import SSEParser, decode_event
from benchmarks.serving.timing import StreamRecord, build_record


class ServerError(RuntimeError):
    """The server answered with an error status (message holds its body)."""

    def __init__(self, status: int, path: str, body: str):
        super().__init__(f"{path}: HTTP {status}: {body[:500]}")
        self.status = status


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 3600.0):
        url = urllib.parse.urlsplit(base_url if "//" in base_url else f"http://{base_url}")
        if url.scheme not in ("http", "https"):
            raise ValueError(f"--url must be http(s)://host:port, got {base_url!r}")
        self.base_url = f"{url.scheme}://{url.netloc}"
        self._https = url.scheme == "https"
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port
        # OpenAI SDKs take ".../v1" as the base URL; our paths carry /v1 themselves.
        self._prefix = url.path.rstrip("/").removesuffix("/v1")
        self.timeout = timeout
        self._headers = {"Content-Type": "application/json", "Accept": "*/*"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    @property
    def host(self) -> str:
        return self._host

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout)
        conn.connect()
        return conn

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = self._connect()
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, self._prefix + path, body=data, headers=self._headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def get_json(self, path: str) -> dict:
        status, data = self.request("GET", path)
        if status != 200:
            raise ServerError(status, path, data.decode(errors="replace"))
        return json.loads(data)

    def get_text(self, path: str) -> str | None:
        """Body of a GET, or None when the server has no such endpoint (404/405)."""
        status, data = self.request("GET", path)
        if status in (404, 405):
            return None
        if status != 200:
            raise ServerError(status, path, data.decode(errors="replace"))
        return data.decode()

    def post_json(self, path: str, body: dict) -> dict:
        status, data = self.request("POST", path, body)
        if status != 200:
            raise ServerError(status, path, data.decode(errors="replace"))
        return json.loads(data)

    def stream(self, path: str, body: dict) -> StreamRecord:
        """POST with ``stream: true``; returns the timestamped, token-attributed record."""
        conn = self._connect()
        events: list[tuple[float, dict]] = []
        parser = SSEParser()
        try:
            data = json.dumps(body).encode()
            t_send = time.perf_counter()
            conn.request("POST", self._prefix + path, body=data, headers=self._headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise ServerError(resp.status, path, resp.read().decode(errors="replace"))
            done = False
            while not done:
                chunk = resp.read1(65536)
                now = time.perf_counter()
                pieces = parser.feed(chunk) if chunk else parser.close()
                for piece in pieces:
                    event = decode_event(piece)
                    if event is None:
                        done = True
                        break
                    if "error" in event and not event.get("choices"):
                        raise ServerError(500, path, json.dumps(event["error"]))
                    events.append((now, event))
                if not chunk:
                    break
            t_end = time.perf_counter()
            # Read the end of the chunked body: closing with unread bytes resets the socket.
            if done:
                resp.read()
        finally:
            conn.close()
        return build_record(t_send, t_end, events)
