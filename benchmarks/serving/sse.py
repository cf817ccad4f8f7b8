"""Incremental parser for ``text/event-stream`` (server-sent events), as vLLM streams them.

Bytes arrive in arbitrary pieces (a TCP read can split a line or hold several events), so
the parser keeps the unfinished line between calls. Rules followed (the WHATWG event-stream
format, the part the OpenAI-compatible servers use): lines end in LF, CR or CRLF; a line
starting with ``:`` is a comment; ``data:`` fields of one event are joined with ``\\n``; one
space after the colon is dropped; an empty line dispatches the event; other fields
(``event``, ``id``, ``retry``) are ignored because the OpenAI protocol does not use them.
"""

from __future__ import annotations

import json

DONE = "[DONE]"


class SSEParser:
    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[str]:
        """Add received bytes; return the data of every event completed by them."""
        if self._pending_cr and chunk.startswith(b"\n"):
            # The CR of a CRLF pair ended the previous piece: the LF is not a new line.
            chunk = chunk[1:]
        self._pending_cr = False
        self._buf += chunk
        events: list[str] = []
        while True:
            cut = _line_end(self._buf)
            if cut is None:
                break
            end, nxt = cut
            line = self._buf[:end].decode("utf-8")
            if nxt == len(self._buf) and self._buf[end : end + 1] == b"\r":
                self._pending_cr = True
            self._buf = self._buf[nxt:]
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[str]:
        """End of stream: an unterminated last line still counts, a pending event is
        dispatched (lenient: a well-formed stream ends with a blank line)."""
        events = []
        if self._buf:
            event = self._line(self._buf.decode("utf-8"))
            self._buf = b""
            if event is not None:
                events.append(event)
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: str) -> str | None:
        if line == "":
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return data
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        return None


def _line_end(buf: bytes) -> tuple[int, int] | None:
    """(end of the first line, start of the next) or None if no complete line yet.

    A CR at the very end of the buffer already ends a line; a following LF is swallowed
    by ``feed`` through ``_pending_cr``.
    """
    lf, cr = buf.find(b"\n"), buf.find(b"\r")
    if lf < 0 and cr < 0:
        return None
    if cr < 0 or (0 <= lf < cr):
        return lf, lf + 1
    if buf[cr + 1 : cr + 2] == b"\n":
        return cr, cr + 2
    return cr, cr + 1


def decode_event(data: str) -> dict | None:
    """The JSON object of one event; None for the ``[DONE]`` terminator."""
    if data.strip() == DONE:
        return None
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError(f"SSE event is not a JSON object: {data[:200]!r}")
    return obj
