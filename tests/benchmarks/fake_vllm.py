"""A stand-in for ``vllm serve`` speaking the slice of the OpenAI API that benchmarks/e2e uses.

Logprobs are a deterministic function of the token ids; ``DEEPINFER_FORCE=1`` (our path)
adds noise of 1e-4 and a checkpoint whose config.json has ``fake_logprob_scale`` scales
the logprobs by it (a perturbed checkpoint), so the orchestrator's verdicts can be checked
without a GPU. Greedy continuations follow ``greedy_next``, the top-1 of the logprobs.
``--speculative-config`` makes /metrics report drafts; with ``FAKE_SPEC_ACCEPTS_WRONG=1``
such a server also emits one token that is not its greedy choice (a broken verifier), and
with ``FAKE_REFUSE_TOKEN_PROMPTS=1`` it answers every completion but a teacher-forced one
with HTTP 500 (a server whose first request fails).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise

VOCAB = 512


def greedy_next(prev: int) -> int:
    return (prev * 7 + 3) % VOCAB


def logprob(prev: int, tok: int, salt: float) -> float:
    """The greedy token leads every other by at least 0.5 nats."""
    if tok == greedy_next(prev):
        return -0.5 + salt
    return -1.0 - ((prev * 31 + tok * 17) % 97) / 25.0 + salt


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, payload, ctype="application/json"):
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, {})
        if self.path == "/v1/models":
            return self._send(200, {"data": [{"id": self.server.name}]})
        if self.path == "/metrics":
            n, name = self.server.drafts, self.server.name
            text = (
                f'vllm:spec_decode_num_drafts_total{{model_name="{self.server.name}"}} {n}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="{name}"}} {5 * n}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{name}"}} {2 * n}\n'
            )
            return self._send(200, text.encode(), "text/plain")
        self._send(404, {})

    def _salt(self, i: int) -> float:
        rng = random.Random(i)
        return self.server.noise * rng.gauss(0, 1)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": "\u00e9x"}
            usage = {"completion_tokens": 2}
            return self._send(200, {"choices": [{"message": message}], "usage": usage})
        ids = req["prompt"]
        if os.environ.get("FAKE_REFUSE_TOKEN_PROMPTS") == "1" and not req.get("echo"):
            return self._send(500, {"error": "refused (FAKE_REFUSE_TOKEN_PROMPTS)"})
        scale = self.server.scale
        if req.get("echo"):
            pairs = list(pairwise(ids))
            lps = [None] + [scale * logprob(a, b, self._salt(i)) for i, (a, b) in enumerate(pairs)]
            tops = [None] + [
                {
                    f"token_id:{b}": lp,
                    f"token_id:{greedy_next(a)}": scale * logprob(a, greedy_next(a), self._salt(i)),
                }
                for i, ((a, b), lp) in enumerate(zip(pairs, lps[1:], strict=True))
            ]
            lp = {
                "tokens": [f"token_id:{t}" for t in ids] + ["token_id:1"],
                "token_logprobs": [*lps, -0.1],
                "top_logprobs": [*tops, {"token_id:1": -0.1}],
            }
            usage = {"prompt_tokens": len(ids)}
            return self._send(200, {"choices": [{"logprobs": lp}], "usage": usage})
        out = [greedy_next(ids[-1])]
        while len(out) < req["max_tokens"]:
            out.append(greedy_next(out[-1]))
        if self.server.speculative:
            self.server.drafts += 1
            if os.environ.get("FAKE_SPEC_ACCEPTS_WRONG") == "1" and len(out) > 3:
                out[3] = (out[3] + 1) % VOCAB  # a draft token accepted against the target
        if req.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for k in range(len(out)):
                usage = {"prompt_tokens": len(ids), "completion_tokens": k + 1}
                ev = {"choices": [{"text": "x", "index": 0}], "usage": usage}
                self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.001)
            self.wfile.write(b"data: [DONE]\n\n")
            return None
        tokens = [f"token_id:{t}" for t in out]
        return self._send(200, {"choices": [{"logprobs": {"tokens": tokens}}]})


def main(argv: list[str]) -> None:
    assert argv[0] == "serve", argv
    model = argv[1]
    port = int(argv[argv.index("--port") + 1])
    name = argv[argv.index("--served-model-name") + 1]
    ThreadingHTTPServer.request_queue_size = 64
    runtime_dir = os.path.basename(os.environ.get("DEEPINFER_RUNTIME_DIR", ""))
    if runtime_dir == f"{os.environ.get('FAKE_VLLM_EXIT')}-runtime":
        sys.exit(3)  # a server that fails at start, like a refused configuration
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.name = name
    srv.noise = 1e-4 if os.environ.get("DEEPINFER_FORCE") == "1" else 0.0
    with open(os.path.join(model, "config.json")) as f:
        srv.scale = json.load(f).get("fake_logprob_scale", 1.0)
    srv.speculative = "--speculative-config" in argv
    srv.drafts = 0
    assert math.isfinite(srv.noise)
    # Two of the start steps vLLM logs, as it words them (benchmarks/e2e/start_timeline.py)
    print("INFO [model_runner.py:428] Model loading took 0.01 GiB memory and 0.25 seconds")
    print("INFO [core.py:412] init engine (profile, create kv cache, warmup model) took 0.50 s",
          flush=True)  # fmt: skip
    srv.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
