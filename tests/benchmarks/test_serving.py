"""benchmarks/serving against a real local HTTP server that imitates vLLM 0.33's OpenAI API.

The fake server (stdlib http.server in a thread) streams chunked SSE with known delays:
prefill takes prompt_tokens / PREFILL_TOK_S, then the first token, then one chunk per
speculative verify step every STEP_S carrying 1 + accepted drafts tokens (a fixed cycle of
acceptances), with vLLM's per-chunk usage, final usage chunk and [DONE]. Its /metrics counts
the same drafts and acceptances, so TTFT, token rates and DSpark acceptance have known
expected values. Echo/logprobs requests return deterministic logprobs shifted per repeat by a
known offset, so the NLL noise and verdict are known too.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.serving import cli, compare, metrics, nll, prompts
from benchmarks.serving.client import Client
from benchmarks.serving.sse import SSEParser, decode_event
from benchmarks.serving.timing import (
    Arrival,
    StreamRecord,
    aggregate_decode,
    build_record,
    rate_by_quarter,
)

PREFILL_TOK_S = 8000.0
STEP_S = 0.03
ACCEPT_CYCLE = (2, 3, 1)  # drafts accepted per verify step, cycled; K = 5 drafted per step
K = 5
MODEL = "fake-dsv41"


def fake_count(text: str) -> int:
    """The fake tokenizer: one token per 4 characters, plus BOS."""
    return 1 + math.ceil(len(text) / 4)


def fake_tokens(text: str) -> list[str]:
    return ["<bos>"] + [text[i : i + 4] for i in range(0, len(text), 4)]


def fake_logprob(token: str) -> float:
    return -0.5 - (sum(map(ord, token)) % 97) / 50.0


class FakeVLLM:
    def __init__(
        self,
        *,
        step_s: float = STEP_S,
        per_chunk_usage: bool = True,
        nll_offsets=(0.0,),
        reject_max_tokens_0: bool = False,
        cache_info: dict | None = None,
    ):
        self.step_s = step_s
        self.per_chunk_usage = per_chunk_usage
        self.nll_offsets = nll_offsets
        self.reject_max_tokens_0 = reject_max_tokens_0
        self.cache_info = (
            cache_info if cache_info is not None else {"kv_cache_size_tokens": "4648480"}
        )
        self.lock = threading.Lock()
        self.c = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "queries": 0, "hits": 0}
        self.per_pos = [0] * K
        self.ttft_sum, self.ttft_count = 0.0, 0
        self.first_token_sent: list[float] = []  # perf_counter() at each first token chunk
        self.seen: set[str] = set()
        self.echo_calls = 0
        self.n_nll_texts = len(prompts.nll_texts(prompts.load_documents()))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def metrics_text(self) -> str:
        lab = f'engine="0",model_name="{MODEL}"'
        c = self.c
        lines = [
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(c['drafts'])}",
            f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e+09",
            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(c['draft_tokens'])}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(c['accepted'])}",
            # Another model's counters must not leak into ours.
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="other"} 999.0',
            f"vllm:prefix_cache_queries_total{{{lab}}} {float(c['queries'])}",
            f"vllm:prefix_cache_hits_total{{{lab}}} {float(c['hits'])}",
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {self.ttft_count}',
            f"vllm:time_to_first_token_seconds_count{{{lab}}} {float(self.ttft_count)}",
            f"vllm:time_to_first_token_seconds_sum{{{lab}}} {self.ttft_sum}",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {float(v)}'
            for p, v in enumerate(self.per_pos)
        ]
        info = ",".join(f'{k}="{v}"' for k, v in {"block_size": "64", **self.cache_info}.items())
        lines.append(f'vllm:cache_config_info{{{info},engine="0"}} 1.0')
        return "\n".join(lines) + "\n"

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, obj, status=200):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    card = {"id": MODEL, "root": "/models/fake", "max_model_len": 131072}
                    return self._json({"object": "list", "data": [card]})
                if self.path == "/version":
                    return self._json({"version": "0.33.0"})
                if self.path == "/metrics":
                    with fake.lock:
                        data = fake.metrics_text().encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    return self.wfile.write(data)
                return self._json({"detail": "Not Found"}, 404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    n = fake_count(body["prompt"])
                    return self._json({"count": n, "max_model_len": 131072, "tokens": []})
                if body.get("echo"):
                    return self._echo(body)
                if self.path in ("/v1/completions", "/v1/chat/completions") and body.get("stream"):
                    return self._stream(body, chat=self.path.endswith("chat/completions"))
                return self._json({"detail": "Not Found"}, 404)

            def _echo(self, body):
                if body["max_tokens"] == 0 and fake.reject_max_tokens_0:
                    return self._json({"error": {"message": "max_tokens must be >= 1"}}, 400)
                toks = fake_tokens(body["prompt"])
                with fake.lock:
                    repeat = fake.echo_calls // fake.n_nll_texts
                    fake.echo_calls += 1
                shift = fake.nll_offsets[repeat % len(fake.nll_offsets)]
                lps = [None] + [fake_logprob(t) + shift for t in toks[1:]]
                if body["max_tokens"] == 1:  # a generated token follows the prompt
                    toks, lps = [*toks, "gen"], [*lps, -123.0]
                lp = {
                    "tokens": toks,
                    "token_logprobs": lps,
                    "top_logprobs": None,
                    "text_offset": [],
                }
                n = len(toks) - (body["max_tokens"] == 1)
                usage = {"prompt_tokens": n, "completion_tokens": body["max_tokens"]}
                return self._json(
                    {"choices": [{"text": body["prompt"], "logprobs": lp}], "usage": usage}
                )

            def _send(self, obj):
                data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
                data += b"\n\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _stream(self, body, chat):
                prompt = body["messages"][0]["content"] if chat else body["prompt"]
                n_prompt = fake_count(prompt) + (5 if chat else 0)
                cont = (body.get("stream_options") or {}).get("continuous_usage_stats")
                per_chunk = fake.per_chunk_usage and cont
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                done = 0

                def chunk(n_new, text, finish=None):
                    if chat:
                        delta = {"reasoning": text} if done < 4 else {"content": text}
                        choice = {"index": 0, "delta": delta, "finish_reason": finish}
                    else:
                        choice = {"index": 0, "text": text, "finish_reason": finish}
                    ev = {"id": "x", "object": "chunk", "model": MODEL, "choices": [choice]}
                    if per_chunk:
                        ev["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": done}
                    self._send(ev)

                if chat:  # role-only chunk before any token: must not count as the first token
                    role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                    ev = {"id": "x", "choices": [role]}
                    if per_chunk:
                        ev["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": 0}
                    self._send(ev)
                t0 = time.perf_counter()
                with fake.lock:
                    hit = prompt in fake.seen
                    fake.seen.add(prompt)
                    fake.c["queries"] += n_prompt
                    fake.c["hits"] += n_prompt if hit else 0
                time.sleep(n_prompt / PREFILL_TOK_S)
                done = 1
                with fake.lock:
                    fake.ttft_sum += time.perf_counter() - t0
                    fake.ttft_count += 1
                total = body["max_tokens"]
                with fake.lock:
                    fake.first_token_sent.append(time.perf_counter())
                chunk(1, "tok ", "length" if total == 1 else None)
                step = 0
                while done < total:
                    time.sleep(fake.step_s)
                    acc = ACCEPT_CYCLE[step % len(ACCEPT_CYCLE)]
                    n = min(acc + 1, total - done)
                    step += 1
                    with fake.lock:
                        fake.c["drafts"] += 1
                        fake.c["draft_tokens"] += K
                        fake.c["accepted"] += n - 1
                        for p in range(n - 1):
                            fake.per_pos[p] += 1
                    done += n
                    chunk(n, "tok " * n, "length" if done >= total else None)
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"prompt_tokens": n_prompt, "completion_tokens": done}
                    self._send({"id": "x", "choices": [], "usage": usage})
                self._send(b"[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler


def _expected_decode(total: int, step_s: float = STEP_S) -> tuple[int, int, float]:
    """(verify steps, accepted drafts, decode tok/s) the fake server produces for ``total``."""
    done, steps, acc_sum = 1, 0, 0
    while done < total:
        n = min(ACCEPT_CYCLE[steps % len(ACCEPT_CYCLE)] + 1, total - done)
        acc_sum += n - 1
        done += n
        steps += 1
    return steps, acc_sum, (total - 1) / (steps * step_s)


def near(measured, expected, rel):
    return measured is not None and abs(measured - expected) <= rel * expected


# ---- SSE parsing ---------------------------------------------------------------------------
STREAM = (
    b": keep-alive comment\r\n\r\n"
    b'data: {"a": 1}\r\n\r\n'
    b'data: {"b":\n'
    b"data: 2}\n\n"
    b'data:{"c": 3}\r\r'
    b"event: ignored\n"
    b'data: {"d": "x\xc3\xa9"}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = ['{"a": 1}', '{"b":\n2}', '{"c": 3}', '{"d": "x\u00e9"}', "[DONE]"]


def test_sse_parser_any_split():
    """Every split point (inside CRLF and inside a UTF-8 character included) gives the same
    events: TCP reads split streams arbitrarily."""
    for cut in range(len(STREAM) + 1):
        p = SSEParser()
        got = p.feed(STREAM[:cut]) + p.feed(STREAM[cut:]) + p.close()
        assert got == EXPECTED, cut
    p = SSEParser()
    got = [e for i in range(len(STREAM)) for e in p.feed(STREAM[i : i + 1])] + p.close()
    assert got == EXPECTED
    assert decode_event(EXPECTED[0]) == {"a": 1} and decode_event(" [DONE]") is None


def test_sse_parser_flushes_unterminated_event_at_close():
    p = SSEParser()
    assert p.feed(b'data: {"x": 1}') == []
    assert p.close() == ['{"x": 1}']


# ---- token attribution and timing arithmetic ------------------------------------------------
def _ev(text, cum=None, ids=None, finish=None):
    choice = {"index": 0, "text": text, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    ev = {"choices": [choice]}
    if cum is not None:
        ev["usage"] = {"prompt_tokens": 100, "completion_tokens": cum}
    return ev


def test_tokens_from_per_chunk_usage_not_chunks():
    events = [
        (1.0, _ev("a", 1)),
        (1.5, _ev("bcd", 4)),  # one verify step, 3 tokens
        (2.0, _ev("", 4)),  # nothing new
        (2.5, _ev("efghij", 10, finish="length")),
        (2.6, {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10}}),
    ]
    rec = build_record(0.5, 2.7, events)
    assert rec.source == "usage"
    assert [(a.t, a.n) for a in rec.arrivals] == [(1.0, 1), (1.5, 3), (2.5, 6)]
    assert rec.ttft_s == pytest.approx(0.5)
    assert rec.prompt_tok_s == pytest.approx(200.0)
    assert rec.decode_tokens == 9 and rec.decode_time_s == pytest.approx(1.5)
    assert rec.decode_tok_s == pytest.approx(6.0)
    assert rec.finish_reason == "length"


def test_tokens_from_token_ids_and_chunk_fallback():
    ids = [(1.0, _ev("a", ids=[5])), (2.0, _ev("bc", ids=[6, 7])), (3.0, _ev("d", ids=[8]))]
    rec = build_record(0.0, 3.0, ids)
    assert rec.source == "token_ids" and rec.total_tokens == 4 and rec.decode_tok_s == 1.5
    # Text chunks only: times from chunks, the total from the final usage.
    chunks = [(1.0, _ev("a")), (2.0, _ev("bc")), (3.0, _ev("d"))]
    chunks.append((3.1, {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}}))
    rec = build_record(0.0, 3.2, chunks)
    assert rec.source == "chunks" and rec.total_tokens == 9
    assert rec.decode_tok_s == pytest.approx(8 / 2.0)


def test_chat_role_chunk_is_not_the_first_token():
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    role["usage"] = {"prompt_tokens": 9, "completion_tokens": 0}
    think = {"choices": [{"index": 0, "delta": {"reasoning": "hm"}}]}
    think["usage"] = {"prompt_tokens": 9, "completion_tokens": 1}
    rec = build_record(0.0, 2.0, [(0.1, role), (0.8, think)])
    assert rec.ttft_s == pytest.approx(0.8) and rec.text_chars == 2


def test_aggregate_and_quarters():
    a = StreamRecord(0.0, 3.0, [Arrival(1.0, 1), Arrival(2.0, 10)], "usage", completion_tokens=11)
    b = StreamRecord(0.0, 4.0, [Arrival(1.5, 1), Arrival(3.0, 20)], "usage", completion_tokens=21)
    agg = aggregate_decode([a, b])
    assert agg["aggregate_decode_tok_s"] == pytest.approx(30 / 2.0)
    assert agg["sum_of_stream_decode_tok_s"] == pytest.approx(10.0 + 20 / 1.5)
    assert agg["end_to_end_tok_s"] == pytest.approx(32 / 4.0)
    # Four equal quarters of 2 tokens, each taking longer than the one before.
    times = [0.0, 1.0, 3.0, 6.0, 10.0]
    rec = StreamRecord(
        0, 10, [Arrival(t, 1 if i == 0 else 2) for i, t in enumerate(times)], "usage"
    )
    assert rate_by_quarter(rec) == pytest.approx([2.0, 1.0, 2 / 3, 0.5])


# ---- Prometheus parsing ---------------------------------------------------------------------
def test_exposition_parser_matches_prometheus_client():
    prom = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    reg = prom.CollectorRegistry()
    c = prom.Counter("vllm:spec_decode_num_drafts", "d", ["model_name", "engine"], registry=reg)
    c.labels('we"ird\\name\nx', "0").inc(7)
    h = prom.Histogram("vllm:time_to_first_token_seconds", "t", ["engine"], registry=reg)
    h.labels("0").observe(0.25)
    g = prom.Gauge("vllm:cache_config_info", "i", ["kv_cache_size_tokens", "engine"], registry=reg)
    g.labels("4648480", "0").set(1)
    text = prom.generate_latest(reg).decode()
    ours = {
        (s.name, tuple(sorted(s.labels.items())), s.value) for s in metrics.parse_exposition(text)
    }
    theirs = {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert ours == theirs and len(ours) >= 9
    snap = metrics.Snapshot(metrics.parse_exposition(text))
    assert snap.counter(metrics.SPEC_DRAFTS) == 7.0
    assert snap.histogram(metrics.TTFT_HIST) == (0.25, 1.0)


def test_exposition_parser_special_values_and_errors():
    s = metrics.parse_exposition('a{x="1"} NaN\nb +Inf 123\n# c 1\nd -Inf\n')
    assert math.isnan(s[0].value) and s[1].value == math.inf and s[2].value == -math.inf
    with pytest.raises(ValueError, match="line 1"):
        metrics.parse_exposition('a{x="1} 3')


def _snap(drafts, draft_tokens, accepted, per_pos, model="m"):
    lab = f'model_name="{model}",engine="0"'
    lines = [
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {draft_tokens}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted}",
        'vllm:spec_decode_num_drafts_total{model_name="other",engine="0"} 1000',
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {v}'
        for p, v in enumerate(per_pos)
    ]
    return metrics.Snapshot.from_text("\n".join(lines), "m")


def test_spec_decode_delta():
    before = _snap(100, 500, 210, [90, 70, 30, 15, 5])
    after = _snap(140, 700, 290, [126, 100, 40, 18, 6])
    d = metrics.spec_decode_delta(before, after)
    assert d["drafts"] == 40 and d["accepted_tokens"] == 80
    assert d["acceptance_per_position"] == pytest.approx([0.9, 0.75, 0.25, 0.075, 0.025])
    assert d["mean_accepted_length"] == pytest.approx(3.0)
    assert d["draft_acceptance_rate"] == pytest.approx(0.4)
    assert d["mean_draft_length"] == pytest.approx(5.0)
    empty = metrics.Snapshot.from_text("vllm:num_requests_running 0\n")
    assert metrics.spec_decode_delta(empty, empty)["available"] is False
    assert "no drafts" in metrics.spec_decode_delta(before, before)["reason"]


def test_kv_capacity_sources():
    two_engines = metrics.Snapshot.from_text(
        'vllm:cache_config_info{engine="0",kv_cache_size_tokens="1000",num_gpu_blocks="9"} 1\n'
        'vllm:cache_config_info{engine="1",kv_cache_size_tokens="2000",num_gpu_blocks="9"} 1\n'
    )
    assert metrics.kv_capacity(two_engines)["tokens"] == 3000
    blocks = metrics.Snapshot.from_text(
        'vllm:cache_config_info{engine="0",kv_cache_size_tokens="None",num_gpu_blocks="72633",'
        'block_size="64"} 1\n'
    )
    cap = metrics.kv_capacity(blocks)
    assert cap["tokens"] == 72633 * 64 and "approximate" in cap["source"]
    log = (
        "INFO ... GPU KV cache size: 4,648,480 tokens\n"
        "INFO ... Maximum concurrency for 1,048,576 tokens per request: 4.43x\n"
    )
    cap = metrics.kv_capacity(None, log)
    assert cap["tokens"] == 4648480 and cap["source"] == "server log"
    assert cap["log"]["max_concurrency"] == [{"tokens_per_request": 1048576, "x": 4.43}]


# ---- prompts --------------------------------------------------------------------------------
def test_prompt_material_and_fitting():
    assert prompts.verify_manifest() == [], "prompt material changed: rebuild the manifest"
    docs = prompts.load_documents()
    assert sum(d.kind == "prose" for d in docs) == 8 and sum(d.kind == "code" for d in docs) > 40
    # Long enough for a 64K-token prefill without repeating (with a 3.5 chars/token estimate).
    assert sum(len(d.render()) for d in docs) > 65536 * prompts.CHARS_PER_TOKEN_ESTIMATE
    p1 = prompts.cold_prefill_prompt(docs, "0123456789abcdef", 3000, fake_count)
    p2 = prompts.cold_prefill_prompt(docs, "fedcba9876543210", 3000, fake_count)
    assert p1.startswith("Request 0123456789abcdef.") and p1[24:] == p2[24:]
    assert 2990 <= fake_count(p1) <= 3000
    assert prompts.new_nonce() != prompts.new_nonce()
    code = prompts.continuation_prompt(docs, prompts.CODE_DECODE_DOC, 500, fake_count)
    assert code.startswith(f"[code: {prompts.CODE_DECODE_DOC}]") and code.endswith("\n")
    assert 450 <= fake_count(code) <= 500
    # Wrap-around and repetition when one pass of the corpus is too short.
    long = prompts.corpus_from(docs, "08_chess_club", 2 * sum(len(d.render()) for d in docs))
    assert "[repeat 2]" in long and long.startswith("[prose: 08_chess_club]")
    with pytest.raises(ValueError, match="not in the corpus"):
        prompts.continuation_prompt(docs, "no-such-doc", 100, fake_count)
    texts = prompts.nll_texts(docs)
    assert texts == prompts.nll_texts(prompts.load_documents()) and len(texts) == 12


# ---- NLL verdict ----------------------------------------------------------------------------
def _nll_section(means, sha="s"):
    runs = [
        {
            "schedule": "x",
            "per_text": [{"name": "t", "tokens": 100, "nll_sum": 100 * m}],
            "mean_nll": m,
        }
        for m in means
    ]
    std = float(__import__("statistics").stdev(means)) if len(means) > 1 else None
    return {
        "texts": [{"name": "t", "chars": 1}],
        "repeats": runs,
        "mean_nll": sum(means) / len(means),
        "run_std": std,
        "tokens_sha256": {"t": sha},
        "token_logprobs": {"t": [-1.0, -2.0]},
    }


def test_nll_verdict_rules():
    a = _nll_section([2.00, 2.01, 1.99])  # std 0.01
    assert nll.verdict(a, _nll_section([2.02, 2.03, 2.01]))["within"] is True  # 0.02 <= 0.03
    out = nll.verdict(a, _nll_section([2.05, 2.06, 2.04]))
    assert out["within"] is False and out["threshold"] == pytest.approx(0.03)
    assert "OUTSIDE" in out["text"] and "k x noise = 3 x" in out["text"]
    # Bit-identical repeats: the stated floor stands in for the zero noise.
    exact = _nll_section([2.0, 2.0, 2.0])
    assert nll.verdict(exact, _nll_section([2.0, 2.0, 2.0]))["noise_source"] == "floor"
    assert nll.verdict(exact, _nll_section([2.0002] * 3))["within"] is (0.0002 <= 3e-4)
    assert nll.verdict(exact, _nll_section([2.001] * 3))["within"] is False
    assert nll.verdict(a, _nll_section([2.0] * 3, sha="other"))["within"] is None
    assert nll.verdict(_nll_section([2.0]), a)["within"] is None


# ---- against the fake server ----------------------------------------------------------------
def _assert_ttft(rec, srv, prompt_tokens: int) -> None:
    """TTFT is the first *token* chunk: not before the server sent it (a role chunk or
    the response headers would be), and not much later (the end of the stream would be).
    Judged against the server's own send time, in the same process and clock, so a
    loaded machine that stretches the fake prefill cannot fail it."""
    sent = srv.first_token_sent[-1] - rec.t_send
    assert sent >= 0.95 * prompt_tokens / PREFILL_TOK_S  # the fake prefill did run
    assert sent - 0.005 <= rec.ttft_s <= sent + 0.1, (rec.ttft_s, sent)


def test_stream_timing_against_server():
    """TTFT and decode tok/s measured over real HTTP match the server's known delays, and
    tokens are counted per verify step (3.0 tokens per chunk here), not per chunk."""
    total = 28
    steps, _, rate = _expected_decode(total)
    with FakeVLLM() as srv:
        client = Client(srv.url)
        prompt = "x" * 4000  # 1001 tokens -> 125 ms prefill
        body = {"model": MODEL, "prompt": prompt, "max_tokens": total, "stream": True}
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        rec = client.stream("/v1/completions", body)
        assert rec.source == "usage" and rec.prompt_tokens == 1001 and rec.total_tokens == total
        assert len(rec.arrivals) == steps + 1
        _assert_ttft(rec, srv, 1001)
        assert near(rec.decode_tok_s, rate, 0.2)
        chunk_rate = steps / (steps * STEP_S)
        assert rec.decode_tok_s > 2 * chunk_rate  # counting chunks would be 3x too low
        # Chat: the role chunk arrives at once and must not be taken as the first token.
        chat = {k: v for k, v in body.items() if k != "prompt"}
        chat["messages"] = [{"role": "user", "content": prompt}]
        rec = client.stream("/v1/chat/completions", chat)
        _assert_ttft(rec, srv, 1006)
        assert rec.total_tokens == total
    # A server without per-chunk usage: chunk times, the total from the final usage chunk.
    with FakeVLLM(per_chunk_usage=False) as srv:
        rec = Client(srv.url).stream("/v1/completions", body)
        assert rec.source == "chunks" and rec.total_tokens == total
        assert near(rec.decode_tok_s, rate, 0.2)


def _run_cli(srv, tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    args = ["--url", srv.url, "--label", name, "--out", str(out), "--quiet", "--repeats", "2"]
    args += ["--decode-tokens", "28", "--long-tokens", "46", "--decode-prompt-tokens", "300"]
    assert cli.main([*args, *extra]) == 0
    return json.loads(out.read_text())


def test_cli_end_to_end_compare_and_nll(tmp_path, capsys):
    wl = "prefill_1k,code_decode,spec_decode_4stream,long_generation,kv_capacity"
    with FakeVLLM(nll_offsets=(0.0, 0.01, -0.01)) as srv:
        a = _run_cli(srv, tmp_path, "optimized", "--workloads", wl, "--nll", "--patches", "")
    rows = {r["workload"]: r for r in a["table"]}
    assert a["server"]["model"] == MODEL and a["server"]["version"] == "0.33.0"
    assert a["client"]["token_fit"] == "server /tokenize" and len(a["warmup"]) == 3

    pre = a["workloads"]["prefill_1k"]
    assert pre["cold_verified"] is True and pre["prefix_cache"]["hit_tokens"] == 0
    assert all(1000 <= s["prompt_tokens"] <= 1024 for s in pre["samples"])
    assert len({s["nonce"] for s in pre["samples"]}) == 2
    assert near(rows["1K cold prefill"]["value"], PREFILL_TOK_S, 0.25)
    assert near(rows["1K time to first token"]["value"], 1024 / PREFILL_TOK_S, 0.3)
    assert pre["server_ttft"]["count"] == 2

    steps, accepted, rate = _expected_decode(28)
    assert near(rows["single-stream Python-code decode"]["value"], rate, 0.2)
    assert near(rows["four-stream speculative decode (aggregate)"]["value"], 4 * rate, 0.25)
    assert near(rows["long generation"]["value"], _expected_decode(46)[2], 0.2)
    assert len(a["workloads"]["long_generation"]["rate_by_quarter"][0]) == 4

    # Acceptance from /metrics deltas: warmup excluded, other model excluded, exact counts.
    spec = a["workloads"]["code_decode"]["spec_decode"]
    assert spec["drafts"] == 2 * steps and spec["accepted_tokens"] == 2 * accepted
    per_step = [ACCEPT_CYCLE[i % 3] for i in range(steps)]
    want = [sum(x > p for x in per_step) / steps for p in range(K)]
    assert spec["acceptance_per_position"] == pytest.approx(want)
    assert spec["mean_accepted_length"] == pytest.approx(1 + accepted / steps)
    spec4 = a["workloads"]["spec_decode_4stream"]["spec_decode"]
    assert spec4["drafts"] == 2 * 4 * steps
    assert rows["GPU-resident KV capacity"]["value"] == 4648480
    assert rows["single-stream Python-code decode: mean accepted length"]["value"] == pytest.approx(
        1 + accepted / steps
    )

    # The NLL: three repeats shifted by 0, +0.01, -0.01 -> std 0.01 exactly.
    assert a["nll"]["run_std"] == pytest.approx(0.01, rel=1e-6)
    assert [r["schedule"] for r in a["nll"]["repeats"]] == list(nll.SCHEDULES)

    # B: a slower server whose NLL is shifted by 0.05 (> 3 x 0.01), refusing max_tokens=0.
    with FakeVLLM(step_s=0.045, nll_offsets=(-0.05, -0.04, -0.06), reject_max_tokens_0=True) as srv:
        b = _run_cli(
            srv,
            tmp_path,
            "baseline",
            "--workloads",
            "prefill_1k,code_decode",
            "--nll",
            "--warmup",
            "0",
        )
    assert b["nll"]["mode"].startswith("max_tokens=1")
    assert b["nll"]["mean_nll"] - a["nll"]["mean_nll"] == pytest.approx(0.05, rel=1e-6)

    capsys.readouterr()
    assert (
        cli.main(
            [
                "--compare",
                str(tmp_path / "optimized.json"),
                str(tmp_path / "baseline.json"),
                "--with-original",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    line = next(
        x for x in text.splitlines() if x.startswith("| single-stream Python-code decode (tok/s)")
    )
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3].endswith("+") and cells[4] == "160.8" and cells[5] == "151.8"
    assert "verdict: OUTSIDE the noise" in text and "k x noise = 3 x 0.01" in text
    assert "DSpark acceptance per draft position, code_decode" in text
    assert "optimized: fake-dsv41 | vLLM 0.33.0" in text and "DEEPINFER_PATCHES=''" in text


def test_cold_check_detects_a_reused_prefix(tmp_path, monkeypatch):
    monkeypatch.setattr(prompts, "new_nonce", lambda: "0000000000000000")
    with FakeVLLM() as srv:
        r = _run_cli(srv, tmp_path, "x", "--workloads", "prefill_1k", "--warmup", "0")
    pre = r["workloads"]["prefill_1k"]
    assert pre["cold_verified"] is False and pre["prefix_cache"]["hit_tokens"] > 0


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit, match="unknown workload 'prefil_16k'"):
        cli.main(["--workloads", "prefil_16k"])
    with pytest.raises(SystemExit, match="--repeats must be >= 1"):
        cli.main(["--repeats", "0"])
    with pytest.raises(ValueError, match="--url must be http"):
        Client("ftp://x")
    with FakeVLLM() as srv, pytest.raises(SystemExit, match="max_model_len 131072"):
        cli.main(["--url", srv.url + "/v1", "--workloads", "prefill_128k", "--quiet"])
    url = srv.url  # shut down now: nothing listens there any more
    with pytest.raises(SystemExit, match="cannot reach the server"):
        cli.main(["--url", url, "--quiet"])


def test_compare_table_formatting():
    def result(label, decode, ttft, sha="s"):
        return {
            "server": {
                "label": label,
                "model": "m",
                "version": "v",
                "gpu": ["G"],
                "patches_declared": None,
            },
            "client": {"prompt_material_sha256": sha, "settings": {"temperature": 0.6}},
            "table": [
                {
                    "workload": "single-stream Python-code decode",
                    "value": decode,
                    "unit": "tok/s",
                    "higher_is_better": True,
                },
                {
                    "workload": "64K time to first token",
                    "value": ttft,
                    "unit": "s",
                    "higher_is_better": False,
                },
            ],
        }

    text = compare.format_compare(result("on", 160.0, 10.0), result("off", 150.0, 12.5, sha="t"))
    lines = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ")}
    assert "+6.7% +" in lines["single-stream Python-code decode (tok/s)"]
    assert "-20.0% +" in lines["64K time to first token (s)"]  # lower TTFT is better
    assert "different prompt material" in text
    assert (
        compare.relative(1.0, None, True) == "n/a" and compare.relative(5, 10, True) == "-50.0% -"
    )


# ---- against vLLM 0.33.0 itself -------------------------------------------------------------
@pytest.mark.vllm
def test_request_bodies_are_what_vllm_understands():
    """Every field we send is a declared field of vLLM's request models (extra fields are
    accepted and silently ignored there), and echo + logprobs=0 + max_tokens=0 becomes
    prompt_logprobs=0 with one internal token."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from benchmarks.serving.workloads import Settings, request_body

    apis = (
        ("completions", "/v1/completions", CompletionRequest),
        ("chat", "/v1/chat/completions", ChatCompletionRequest),
    )
    for api, want_path, cls in apis:
        path, body = request_body(Settings(api=api, seed=7), MODEL, "def f():\n", 64)
        assert path == want_path and set(body) <= set(cls.model_fields), set(body) - set(
            cls.model_fields
        )
        req = cls(**body)
        assert req.stream_options.include_usage and req.stream_options.continuous_usage_stats
        assert req.ignore_eos and req.seed == 7
    body = nll.echo_body(MODEL, "some text")
    assert set(body) <= set(CompletionRequest.model_fields)
    params = CompletionRequest(**body).to_sampling_params(max_tokens=5)
    assert params.prompt_logprobs == 0 and params.logprobs == 0 and params.max_tokens == 1


@pytest.mark.vllm
def test_metrics_read_from_vllms_own_prometheus_loggers():
    """vLLM's SpecDecodingProm and CacheConfig.metrics_info produce the exposition; our
    parser and deltas read back what was observed."""
    import types

    import prometheus_client
    from vllm.config import CacheConfig
    from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats

    before = set(prometheus_client.REGISTRY._collector_to_names)
    try:
        prom = SpecDecodingProm(
            types.SimpleNamespace(num_speculative_tokens=K),
            ["model_name", "engine"],
            {0: [MODEL, "0"]},
        )

        def observe(accepted_per_step):
            stats = SpecDecodingStats.new(K)
            for acc in accepted_per_step:
                stats.observe_draft(K, acc)
            prom.observe(stats, 0)

        observe([5, 5])  # earlier traffic: excluded by the delta
        snap0 = metrics.Snapshot.from_text(prometheus_client.generate_latest().decode(), MODEL)
        observe([2, 3, 1, 0])
        snap1 = metrics.Snapshot.from_text(prometheus_client.generate_latest().decode(), MODEL)
        d = metrics.spec_decode_delta(snap0, snap1)
        assert d["drafts"] == 4 and d["accepted_tokens"] == 6
        assert d["acceptance_per_position"] == pytest.approx([0.75, 0.5, 0.25, 0.0, 0.0])
        assert d["mean_accepted_length"] == pytest.approx(2.5)

        cfg = CacheConfig()
        cfg.num_gpu_blocks, cfg.block_size, cfg.kv_cache_size_tokens = 72633, 64, 4648480
        labels = cfg.metrics_info() | {"engine": "0"}
        gauge = prometheus_client.Gauge(
            metrics.CACHE_INFO, "info", labelnames=list(labels), registry=None
        )
        gauge.labels(**labels).set(1)
        reg = prometheus_client.CollectorRegistry()
        reg.register(gauge)
        cap = metrics.kv_capacity(
            metrics.Snapshot.from_text(prometheus_client.generate_latest(reg).decode())
        )
        assert cap["tokens"] == 4648480 and cap["engines"][0]["num_gpu_blocks"] == "72633"
    finally:
        for collector in set(prometheus_client.REGISTRY._collector_to_names) - before:
            prometheus_client.REGISTRY.unregister(collector)
