"""The end-to-end workloads of the original's table, run against one server.

Each workload returns its table rows (the original's row names) and a details dict with
every sample. Prometheus counters are scraped right before and after a workload's measured
requests (after the warmup), so the deltas belong to that workload alone: run on a server
nobody else is using.

- ``prefill_<N>k``: cold prefill of N*1024 prompt tokens, max_tokens=1, one request at a
  time, ``repeats`` times, each with a fresh nonce (see prompts.py). Rows: "<N>K cold
  prefill" (median prompt tok/s) and "<N>K time to first token" (median seconds).
- ``code_decode``: one stream continuing Python source, ``decode_tokens`` tokens. Row:
  "single-stream Python-code decode" (median decode tok/s).
- ``spec_decode_4stream``: ``streams`` (4) concurrent continuations, two of code and two of
  prose, released together. Row: "four-stream speculative decode (aggregate)" (median of the
  per-repeat aggregate decode tok/s).
- ``long_generation``: one stream continuing a story for ``long_tokens`` tokens. Row: "long
  generation" (median decode tok/s), plus the rate per quarter of the output.
- ``kv_capacity``: the KV capacity the server reports. Row: "GPU-resident KV capacity".
- ``nll``: the prompt-logprob measurement of nll.py (no table row; compared by --compare).

Decode requests use ``ignore_eos`` (a vLLM extension) so every run generates exactly the
requested number of tokens, and sample with the stated temperature/top_p: both A and B
must use the same settings (they are recorded and --compare checks them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from benchmarks.serving import metrics, nll, prompts
from benchmarks.serving.client import Client, ServerError
from benchmarks.serving.timing import (
    StreamRecord,
    aggregate_decode,
    median,
    rate_by_quarter,
)
from benchmarks.serving.together import run_together

PREFILL = re.compile(r"^prefill_(\d+)k$")
DEFAULT_WORKLOADS = (
    "prefill_16k",
    "prefill_64k",
    "code_decode",
    "spec_decode_4stream",
    "long_generation",
    "kv_capacity",
)
KNOWN = ("code_decode", "spec_decode_4stream", "long_generation", "kv_capacity", "nll")
CHAT_INSTRUCTION = (
    "Continue the following text exactly where it stops, in the same style and language, "
    "without any introduction or commentary:\n\n"
)


@dataclass
class Settings:
    api: str = "completions"  # or "chat"
    repeats: int = 3
    warmup: int = 1
    decode_tokens: int = 1024
    long_tokens: int = 4096
    decode_prompt_tokens: int = 1024
    streams: int = 4
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int | None = None
    ignore_eos: bool = True
    extra_body: dict = field(default_factory=dict)
    nll_repeats: int = 3

    def comparable(self) -> dict:
        """The settings that must match between an A and a B run."""
        d = asdict(self)
        d.pop("warmup")
        return d


def validate_workloads(names: list[str]) -> list[str]:
    for name in names:
        if not (PREFILL.match(name) or name in KNOWN):
            raise ValueError(
                f"unknown workload {name!r}; known: prefill_<N>k (e.g. prefill_16k), "
                f"{', '.join(KNOWN)}"
            )
    return names


def row(workload: str, value, unit: str, higher_is_better: bool, source: str) -> dict:
    return {
        "workload": workload,
        "value": value,
        "unit": unit,
        "higher_is_better": higher_is_better,
        "from": source,
    }


def request_body(
    s: Settings, model: str, prompt: str, max_tokens: int, *, greedy: bool = False
) -> tuple[str, dict]:
    """(path, JSON body) of one streamed generation request."""
    common = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.0 if greedy else s.temperature,
        "ignore_eos": s.ignore_eos,
    }
    if not greedy:
        common["top_p"] = s.top_p
        if s.seed is not None:
            common["seed"] = s.seed
    if s.api == "chat":
        msg = [{"role": "user", "content": CHAT_INSTRUCTION + prompt}]
        return "/v1/chat/completions", {**common, "messages": msg, **s.extra_body}
    return "/v1/completions", {**common, "prompt": prompt, **s.extra_body}


class Bench:
    def __init__(
        self,
        client: Client,
        model: str,
        settings: Settings,
        log: Callable[[str], None] = print,
    ):
        self.client = client
        self.model = model
        self.s = settings
        self.log = log
        self.docs = prompts.load_documents()
        self.count, self.count_source = self._token_counter()

    # ---- plumbing -------------------------------------------------------------------------
    def _token_counter(self):
        try:
            self.client.post_json("/tokenize", {"model": self.model, "prompt": "probe"})
        except (ServerError, OSError, ValueError):
            return prompts.estimate_tokens, "estimate (len/3.5; the server has no /tokenize)"

        def count(text: str) -> int:
            return int(
                self.client.post_json("/tokenize", {"model": self.model, "prompt": text})["count"]
            )

        return count, "server /tokenize"

    def scrape(self) -> metrics.Snapshot | None:
        try:
            text = self.client.get_text("/metrics")
        except (ServerError, OSError):
            return None
        return metrics.Snapshot.from_text(text, self.model) if text is not None else None

    def body(self, prompt: str, max_tokens: int, *, greedy: bool = False) -> tuple[str, dict]:
        return request_body(self.s, self.model, prompt, max_tokens, greedy=greedy)

    def one(self, prompt: str, max_tokens: int, *, greedy: bool = False) -> StreamRecord:
        path, body = self.body(prompt, max_tokens, greedy=greedy)
        return self.client.stream(path, body)

    def concurrent(self, prompt_list: list[str], max_tokens: int) -> list[StreamRecord]:
        """All streams released together (barrier) so they decode side by side."""
        calls = [lambda p=p: self.one(p, max_tokens) for p in prompt_list]
        return run_together(calls, barrier=True)

    def _cold_prompt(self, tokens: int) -> tuple[str, str]:
        nonce = prompts.new_nonce()
        return nonce, prompts.cold_prefill_prompt(self.docs, nonce, tokens, self.count)

    def _stream_prompts(self) -> list[str]:
        docs = prompts.STREAM_DOCS
        return [
            prompts.continuation_prompt(
                self.docs, docs[i % len(docs)], self.s.decode_prompt_tokens, self.count
            )
            for i in range(self.s.streams)
        ]

    # ---- warmup ---------------------------------------------------------------------------
    def warmup(self, workloads: list[str]) -> list[dict]:
        """Compile, capture and page in before anything is timed: a prefill, a single
        stream and a burst of ``streams`` concurrent streams, ``warmup`` times."""
        out = []
        sizes = [int(m.group(1)) * 1024 for w in workloads if (m := PREFILL.match(w))]
        prefill_tokens = min([*sizes, 16384]) if sizes else 1024
        code = prompts.continuation_prompt(
            self.docs, prompts.CODE_DECODE_DOC, self.s.decode_prompt_tokens, self.count
        )
        for i in range(self.s.warmup):
            self.log(f"warmup {i + 1}/{self.s.warmup}")
            _, cold = self._cold_prompt(prefill_tokens)
            out.append({"prefill": self.one(cold, 1, greedy=True).summary()})
            out.append({"single": self.one(code, 64).summary()})
            burst = self.concurrent(self._stream_prompts(), 32)
            out.append({"burst": [r.summary() for r in burst]})
        return out

    # ---- workloads ------------------------------------------------------------------------
    def prefill(self, kilo_tokens: int) -> tuple[list[dict], dict]:
        target = kilo_tokens * 1024
        samples = []
        prompts_ = [self._cold_prompt(target) for _ in range(self.s.repeats)]
        before = self.scrape()
        for i, (nonce, prompt) in enumerate(prompts_):
            rec = self.one(prompt, 1, greedy=True)
            samples.append(rec.summary() | {"nonce": nonce})
            self.log(
                f"  prefill {kilo_tokens}K {i + 1}/{self.s.repeats}: {rec.prompt_tokens} tokens, "
                f"TTFT {rec.ttft_s:.3f} s, {rec.prompt_tok_s or 0:.1f} tok/s"
            )
        after = self.scrape()
        cache = metrics.prefix_cache_delta(before, after)
        cached = [s["cached_tokens"] for s in samples if s["cached_tokens"] is not None]
        if cache is not None:
            cold = cache["hit_tokens"] == 0
        elif cached:
            cold = all(c == 0 for c in cached)
        else:
            cold = None
        ttft = median([s["ttft_s"] for s in samples])
        rate = median([s["prompt_tok_s"] for s in samples])
        details = {
            "target_tokens": target,
            "samples": samples,
            "median_ttft_s": ttft,
            "median_prompt_tok_s": rate,
            "prefix_cache": cache,
            "cold_verified": cold,
            "server_ttft": metrics.histogram_mean_delta(before, after, metrics.TTFT_HIST),
            "server_prefill_time": metrics.histogram_mean_delta(
                before, after, metrics.PREFILL_HIST
            ),
        }
        src = f"prefill_{kilo_tokens}k"
        rows = [
            row(f"{kilo_tokens}K cold prefill", rate, "tok/s", True, src),
            row(f"{kilo_tokens}K time to first token", ttft, "s", False, src),
        ]
        return rows, details

    def _decode(self, name: str, label: str, prompt: str, max_tokens: int):
        samples, records = [], []
        before = self.scrape()
        for i in range(self.s.repeats):
            rec = self.one(prompt, max_tokens)
            records.append(rec)
            samples.append(rec.summary())
            self.log(
                f"  {name} {i + 1}/{self.s.repeats}: {rec.total_tokens} tokens, "
                f"{rec.decode_tok_s or 0:.1f} tok/s ({rec.source})"
            )
        spec = metrics.spec_decode_delta(before, self.scrape())
        rate = median([s["decode_tok_s"] for s in samples])
        details = {
            "prompt_tokens": samples[0]["prompt_tokens"] if samples else None,
            "max_tokens": max_tokens,
            "samples": samples,
            "median_decode_tok_s": rate,
            "spec_decode": spec,
        }
        rows = [row(label, rate, "tok/s", True, name), *_acceptance_rows(label, spec, name)]
        return rows, details, records

    def code_decode(self):
        prompt = prompts.continuation_prompt(
            self.docs, prompts.CODE_DECODE_DOC, self.s.decode_prompt_tokens, self.count
        )
        rows, details, _ = self._decode(
            "code_decode", "single-stream Python-code decode", prompt, self.s.decode_tokens
        )
        return rows, details | {"document": prompts.CODE_DECODE_DOC}

    def long_generation(self):
        prompt = prompts.continuation_prompt(
            self.docs, prompts.LONG_GENERATION_DOC, self.s.decode_prompt_tokens, self.count
        )
        rows, details, records = self._decode(
            "long_generation", "long generation", prompt, self.s.long_tokens
        )
        details["rate_by_quarter"] = [rate_by_quarter(r) for r in records]
        return rows, details | {"document": prompts.LONG_GENERATION_DOC}

    def multi_stream(self):
        n = self.s.streams
        label = "four-stream" if n == 4 else f"{n}-stream"
        label = f"{label} speculative decode (aggregate)"
        prompt_list = self._stream_prompts()
        repeats = []
        before = self.scrape()
        for i in range(self.s.repeats):
            recs = self.concurrent(prompt_list, self.s.decode_tokens)
            agg = aggregate_decode(recs)
            repeats.append(agg | {"streams_detail": [r.summary() for r in recs]})
            self.log(
                f"  {n} streams {i + 1}/{self.s.repeats}: aggregate "
                f"{agg['aggregate_decode_tok_s'] or 0:.1f} tok/s"
            )
        spec = metrics.spec_decode_delta(before, self.scrape())
        rate = median([r["aggregate_decode_tok_s"] for r in repeats])
        details = {
            "streams": n,
            "documents": [prompts.STREAM_DOCS[i % len(prompts.STREAM_DOCS)] for i in range(n)],
            "max_tokens": self.s.decode_tokens,
            "repeats": repeats,
            "median_aggregate_decode_tok_s": rate,
            "spec_decode": spec,
        }
        name = "spec_decode_4stream"
        rows = [row(label, rate, "tok/s", True, name), *_acceptance_rows(label, spec, name)]
        return rows, details

    def kv_capacity(self, server_log: str | None = None):
        cap = metrics.kv_capacity(self.scrape(), server_log)
        return [row("GPU-resident KV capacity", cap["tokens"], "tokens", True, "kv_capacity")], cap

    def nll(self):
        texts = prompts.nll_texts(self.docs)
        section = nll.measure(self.client, self.model, texts, self.s.nll_repeats)
        self.log(
            f"  NLL over {len(texts)} texts: mean {section['mean_nll']:.5f} nats/token, "
            f"run-to-run std {section['run_std']}"
        )
        return [], section

    def run(self, name: str, server_log: str | None = None):
        if m := PREFILL.match(name):
            return self.prefill(int(m.group(1)))
        if name == "kv_capacity":
            return self.kv_capacity(server_log)
        return {
            "code_decode": self.code_decode,
            "spec_decode_4stream": self.multi_stream,
            "long_generation": self.long_generation,
            "nll": self.nll,
        }[name]()


def _acceptance_rows(label: str, spec: dict, source: str) -> list[dict]:
    if not spec.get("available") or "mean_accepted_length" not in spec:
        return []
    return [
        row(
            f"{label}: mean accepted length",
            spec["mean_accepted_length"],
            "tokens/step",
            True,
            source,
        ),
    ]
