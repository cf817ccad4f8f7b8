"""From timestamped stream events to TTFT and token rates (pure arithmetic, no I/O).

Tokens, not chunks: with speculative decoding one SSE chunk carries every token accepted in
a verify step (1 to K+1), so counting chunks would understate DSpark by its acceptance
length. The count comes from the server's own usage accounting, in this order:

1. ``usage.completion_tokens`` on every chunk (``stream_options.continuous_usage_stats``,
   a vLLM extension we request): cumulative and exact, so each chunk's token count is the
   difference to the previous one;
2. ``choices[i].token_ids`` (vLLM's ``return_token_ids``) when present: exact per chunk;
3. otherwise chunks carrying text: arrival times only; the total still comes from the final
   usage chunk (``include_usage``), and the first chunk is assumed to hold one token.
   Marked ``"chunks"`` in the results: an approximation.

The server's usage is preferred over a local tokenizer because it is the server's tokenizer,
after its chat template and detokenization, with nothing to install on the client.

Definitions (t_send: just before the request is written; times from ``time.perf_counter``):
- TTFT = first token-carrying event - t_send (so it includes queueing and the network).
- prompt tok/s (cold prefill) = usage.prompt_tokens / TTFT.
- decode tok/s of a stream = (completion_tokens - tokens of the first event)
  / (last token event - first token event): the prefill's first token is excluded, as is
  TTFT, so this is the steady generation rate.
- aggregate decode tok/s of N concurrent streams = sum of the streams' decode tokens
  / (latest last-token time - earliest first-token time).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arrival:
    t: float  # perf_counter seconds
    n: int  # tokens that arrived with this event


@dataclass
class StreamRecord:
    t_send: float
    t_end: float
    arrivals: list[Arrival]
    source: str  # "usage" | "token_ids" | "chunks"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    server_metrics: dict | None = None  # vLLM's per-request "metrics" (spec decode), if sent
    text_chars: int = 0
    finish_reason: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return sum(a.n for a in self.arrivals)

    @property
    def ttft_s(self) -> float | None:
        return self.arrivals[0].t - self.t_send if self.arrivals else None

    @property
    def decode_tokens(self) -> int:
        return self.total_tokens - self.arrivals[0].n if self.arrivals else 0

    @property
    def decode_time_s(self) -> float:
        return self.arrivals[-1].t - self.arrivals[0].t if self.arrivals else 0.0

    @property
    def decode_tok_s(self) -> float | None:
        dt, n = self.decode_time_s, self.decode_tokens
        return n / dt if dt > 0 and n > 0 else None

    @property
    def prompt_tok_s(self) -> float | None:
        ttft = self.ttft_s
        return self.prompt_tokens / ttft if self.prompt_tokens and ttft else None

    def summary(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.total_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft_s": self.ttft_s,
            "prompt_tok_s": self.prompt_tok_s,
            "decode_tokens": self.decode_tokens,
            "decode_time_s": self.decode_time_s,
            "decode_tok_s": self.decode_tok_s,
            "e2e_s": self.t_end - self.t_send,
            "token_events": len(self.arrivals),
            "token_count_source": self.source,
            "finish_reason": self.finish_reason,
            "server_request_metrics": self.server_metrics,
        }


def _choice_text(choice: dict) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    # vLLM 0.33 streams reasoning as "reasoning"; older servers as "reasoning_content".
    return "".join(
        delta.get(k) or "" for k in ("content", "reasoning", "reasoning_content")
    ) + "".join(
        (tc.get("function") or {}).get("arguments") or "" for tc in delta.get("tool_calls") or []
    )


def build_record(t_send: float, t_end: float, events: list[tuple[float, dict]]) -> StreamRecord:
    """Attribute tokens to the timestamped JSON events of one streamed request (n=1)."""
    with_choices = [(t, e) for t, e in events if e.get("choices")]
    per_chunk_usage = any(
        (e.get("usage") or {}).get("completion_tokens") is not None for _, e in with_choices
    )
    has_ids = any(c.get("token_ids") is not None for _, e in with_choices for c in e["choices"])
    source = "usage" if per_chunk_usage else "token_ids" if has_ids else "chunks"

    arrivals: list[Arrival] = []
    seen = 0
    chars = 0
    finish = None
    for t, e in with_choices:
        choice = e["choices"][0]
        chars += len(_choice_text(choice))
        finish = choice.get("finish_reason") or finish
        if source == "usage":
            cum = (e.get("usage") or {}).get("completion_tokens")
            if cum is None:
                continue
            n, seen = max(0, cum - seen), max(seen, cum)
        elif source == "token_ids":
            n = len(choice.get("token_ids") or [])
        else:
            n = 1 if _choice_text(choice) else 0
        if n > 0:
            arrivals.append(Arrival(t, n))

    final_usage = next((e["usage"] for _, e in reversed(events) if e.get("usage")), None) or {}
    details = final_usage.get("prompt_tokens_details") or {}
    server_metrics = next((e["metrics"] for _, e in reversed(events) if e.get("metrics")), None)
    return StreamRecord(
        t_send=t_send,
        t_end=t_end,
        arrivals=arrivals,
        source=source,
        prompt_tokens=final_usage.get("prompt_tokens"),
        completion_tokens=final_usage.get("completion_tokens"),
        cached_tokens=details.get("cached_tokens"),
        server_metrics=server_metrics,
        text_chars=chars,
        finish_reason=finish,
    )


def aggregate_decode(records: list[StreamRecord]) -> dict:
    """Aggregate decode rate of concurrent streams (definition in the module docstring)."""
    live = [r for r in records if r.arrivals]
    if not live:
        return {"aggregate_decode_tok_s": None}
    first = min(r.arrivals[0].t for r in live)
    last = max(r.arrivals[-1].t for r in live)
    tokens = sum(r.decode_tokens for r in live)
    start = min(r.t_send for r in records)
    end = max(r.t_end for r in records)
    return {
        "aggregate_decode_tok_s": tokens / (last - first) if last > first else None,
        "decode_tokens": tokens,
        "window_s": last - first,
        "sum_of_stream_decode_tok_s": sum(r.decode_tok_s or 0.0 for r in live),
        "end_to_end_tok_s": sum(r.total_tokens for r in records) / (end - start),
        "streams": len(records),
    }


def rate_by_quarter(record: StreamRecord) -> list[float | None]:
    """Decode tok/s in each quarter of the generated tokens: shows how the rate falls as the
    context grows during a long generation."""
    if len(record.arrivals) < 5:
        return []
    t0 = record.arrivals[0].t
    marks, cum = [], 0
    for a in record.arrivals[1:]:
        cum += a.n
        marks.append((cum, a.t))
    total = marks[-1][0]
    rates: list[float | None] = []
    prev_n, prev_t = 0, t0
    for q in (1, 2, 3, 4):
        goal = total * q / 4
        n, t = next((n, t) for n, t in marks if n >= goal)
        rates.append((n - prev_n) / (t - prev_t) if t > prev_t else None)
        prev_n, prev_t = n, t
    return rates


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None
