"""The server's Prometheus ``/metrics``: a text-format parser and the numbers we read.

Names are vLLM 0.33.0's (``vllm/v1/spec_decode/metrics.py``, ``vllm/v1/metrics/loggers.py``);
prometheus_client exposes a counter ``X`` as ``X_total`` (plus an ``X_created`` gauge):

- ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total{position="i"}``
  (labels ``model_name``, ``engine``): speculative-decoding counters. Per vLLM's own
  definitions, acceptance at draft position i = accepted_per_pos[i] / drafts, and the mean
  accepted length (bonus token included) = 1 + accepted / drafts.
- ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``: tokens looked up
  in and found in the prefix cache (to prove a cold prefill was cold).
- ``vllm:time_to_first_token_seconds`` and ``vllm:request_prefill_time_seconds``
  histograms: server-side cross-checks of the client's TTFT.
- ``vllm:cache_config_info``: an info gauge whose labels are the engine's CacheConfig,
  including ``num_gpu_blocks``, ``block_size``, ``kv_cache_size_tokens`` (group-aware token
  capacity per engine) and ``kv_cache_max_concurrency``.

Counters are read as before/after deltas around a workload, summed over engines; a filter
on ``model_name`` keeps other served models out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
TTFT_HIST = "vllm:time_to_first_token_seconds"
PREFILL_HIST = "vllm:request_prefill_time_seconds"
CACHE_INFO = "vllm:cache_config_info"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse_exposition(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (format 0.0.4); comments are skipped."""
    samples = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if not m:
            raise ValueError(f"/metrics line {lineno}: no metric name: {raw[:120]!r}")
        name, pos = m.group(0), m.end()
        labels: dict[str, str] = {}
        if line[pos : pos + 1] == "{":
            labels, pos = _labels(line, pos + 1, lineno)
        rest = line[pos:].split()
        if not rest:
            raise ValueError(f"/metrics line {lineno}: no value: {raw[:120]!r}")
        samples.append(Sample(name, labels, _float(rest[0], lineno)))
    return samples


def _labels(line: str, pos: int, lineno: int) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    while True:
        while line[pos : pos + 1] in (" ", ","):
            pos += 1
        if line[pos : pos + 1] == "}":
            return labels, pos + 1
        m = _NAME.match(line, pos)
        if not m or line[m.end() : m.end() + 2] != '="':
            raise ValueError(f"/metrics line {lineno}: bad label at column {pos}")
        key, pos = m.group(0), m.end() + 2
        out = []
        while True:
            if pos >= len(line):
                raise ValueError(f"/metrics line {lineno}: unterminated label value")
            ch = line[pos]
            if ch == "\\":
                out.append(_ESCAPES.get(line[pos + 1 : pos + 2], line[pos + 1 : pos + 2]))
                pos += 2
            elif ch == '"':
                pos += 1
                break
            else:
                out.append(ch)
                pos += 1
        labels[key] = "".join(out)


def _float(token: str, lineno: int) -> float:
    special = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if token in special:
        return special[token]
    try:
        return float(token)
    except ValueError:
        raise ValueError(f"/metrics line {lineno}: bad value {token!r}") from None


class Snapshot:
    """One scrape of /metrics, with lookups that tolerate a counter with or without the
    ``_total`` suffix and filter on ``model_name`` when given."""

    def __init__(self, samples: list[Sample], model: str | None = None):
        self.samples = samples
        self.model = model

    @classmethod
    def from_text(cls, text: str, model: str | None = None) -> Snapshot:
        return cls(parse_exposition(text), model)

    def _match(self, name: str, **labels: str) -> list[Sample]:
        out = []
        for s in self.samples:
            if s.name != name:
                continue
            if self.model is not None and s.labels.get("model_name", self.model) != self.model:
                continue
            if all(s.labels.get(k) == v for k, v in labels.items()):
                out.append(s)
        return out

    def has(self, base: str) -> bool:
        return bool(self._match(base + "_total") or self._match(base))

    def counter(self, base: str, **labels: str) -> float:
        """Sum over engines of counter ``base`` (0 if absent)."""
        found = self._match(base + "_total", **labels) or self._match(base, **labels)
        return sum(s.value for s in found)

    def per_label(self, base: str, label: str) -> dict[str, float]:
        """Counter ``base`` summed over engines, split by the value of ``label``."""
        out: dict[str, float] = {}
        for s in self._match(base + "_total") or self._match(base):
            key = s.labels.get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + s.value
        return out

    def histogram(self, base: str) -> tuple[float, float]:
        """(sum, count) of histogram ``base`` over engines."""
        return (
            sum(s.value for s in self._match(base + "_sum")),
            sum(s.value for s in self._match(base + "_count")),
        )

    def info(self, name: str) -> list[dict[str, str]]:
        """Label sets of an info-style gauge (one per engine); no model filter: vLLM's
        cache_config_info carries no model_name label."""
        return [s.labels for s in self.samples if s.name == name]


def spec_decode_delta(before: Snapshot | None, after: Snapshot | None) -> dict:
    """DSpark (any vLLM speculative method) acceptance over the interval between scrapes."""
    if before is None or after is None:
        return {"available": False, "reason": "no /metrics scrape"}
    if not after.has(SPEC_DRAFTS):
        return {"available": False, "reason": "server exports no spec-decode counters"}
    drafts = after.counter(SPEC_DRAFTS) - before.counter(SPEC_DRAFTS)
    draft_tokens = after.counter(SPEC_DRAFT_TOKENS) - before.counter(SPEC_DRAFT_TOKENS)
    accepted = after.counter(SPEC_ACCEPTED) - before.counter(SPEC_ACCEPTED)
    pos_after = after.per_label(SPEC_ACCEPTED_PER_POS, "position")
    pos_before = before.per_label(SPEC_ACCEPTED_PER_POS, "position")
    per_pos = {
        int(p): pos_after[p] - pos_before.get(p, 0.0)
        for p in sorted(pos_after, key=lambda p: int(p))
    }
    out: dict = {
        "available": True,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "accepted_per_position": [per_pos[p] for p in sorted(per_pos)],
    }
    if drafts <= 0:
        out["reason"] = "no drafts in the interval"
        return out
    out.update(
        acceptance_per_position=[per_pos[p] / drafts for p in sorted(per_pos)],
        mean_accepted_length=1.0 + accepted / drafts,
        draft_acceptance_rate=accepted / draft_tokens if draft_tokens > 0 else None,
        mean_draft_length=draft_tokens / drafts,
    )
    return out


def prefix_cache_delta(before: Snapshot | None, after: Snapshot | None) -> dict | None:
    if before is None or after is None or not after.has(PREFIX_QUERIES):
        return None
    return {
        "queried_tokens": after.counter(PREFIX_QUERIES) - before.counter(PREFIX_QUERIES),
        "hit_tokens": after.counter(PREFIX_HITS) - before.counter(PREFIX_HITS),
    }


def histogram_mean_delta(before: Snapshot | None, after: Snapshot | None, base: str):
    """Mean of the observations added to histogram ``base`` between the scrapes."""
    if before is None or after is None:
        return None
    (s1, c1), (s0, c0) = after.histogram(base), before.histogram(base)
    return {"count": c1 - c0, "mean_s": (s1 - s0) / (c1 - c0)} if c1 > c0 else None


_LOG_KV = re.compile(r"KV cache size: ([\d,]+) tokens")
_LOG_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def kv_capacity(snapshot: Snapshot | None, server_log: str | None = None) -> dict:
    """GPU-resident KV capacity the server reports.

    Primary: ``kv_cache_size_tokens`` of vllm:cache_config_info, summed over engines (it is
    per data-parallel engine). Fallback: ``num_gpu_blocks * block_size`` (vLLM warns this can
    be wrong for hybrid models, so it is labelled). Or the "KV cache size: N tokens" line of
    the server log when given.
    """
    out: dict = {"tokens": None, "source": None}
    engines = snapshot.info(CACHE_INFO) if snapshot is not None else []
    if engines:
        keep = ("engine", "num_gpu_blocks", "block_size", "kv_cache_size_tokens")
        keep += ("kv_cache_max_concurrency", "cache_dtype", "gpu_memory_utilization")
        out["engines"] = [{k: e[k] for k in keep if k in e} for e in engines]
        sizes = [_int(e.get("kv_cache_size_tokens")) for e in engines]
        if all(s is not None for s in sizes):
            out.update(tokens=sum(sizes), source=f"{CACHE_INFO} kv_cache_size_tokens")
        else:
            blocks = [(_int(e.get("num_gpu_blocks")), _int(e.get("block_size"))) for e in engines]
            if all(b is not None and s is not None for b, s in blocks):
                # The front end sums num_gpu_blocks over DP engines into every label set.
                nb, bs = blocks[0]
                out.update(
                    tokens=nb * bs,
                    source=f"{CACHE_INFO} num_gpu_blocks*block_size (approximate for "
                    "hybrid KV groups)",
                )
    if server_log is not None:
        kv = _LOG_KV.findall(server_log)
        conc = _LOG_CONC.findall(server_log)
        out["log"] = {
            "kv_cache_tokens": [int(x.replace(",", "")) for x in kv],
            "max_concurrency": [
                {"tokens_per_request": int(a.replace(",", "")), "x": float(b)} for a, b in conc
            ],
        }
        if out["tokens"] is None and kv:
            out.update(tokens=int(kv[-1].replace(",", "")), source="server log")
    return out


def _int(value: str | None) -> int | None:
    if value is None or value in ("", "None"):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None
