"""What the comparison asks a server: teacher-forced logprobs and greedy continuations.

Teacher-forced: ``/v1/completions`` with the prompt as token ids, ``echo`` and
``logprobs=1``: vLLM 0.33.0 returns, for every prompt token after the first, its own
logprob and the top-1 token (``return_tokens_as_token_ids`` makes the keys ``token_id:N``,
so byte tokens that decode alike stay apart). Greedy: temperature 0, ``ignore_eos``, a fixed
number of tokens, read back as ids the same way.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

from benchmarks.e2e.prompts import GREEDY_TOKENS, sha256_ids
from benchmarks.serving.client import Client


def _token_id(key: str) -> int:
    prefix = "token_id:"
    if not key.startswith(prefix):
        raise ValueError(f"expected a token_id:N key, got {key!r} (return_tokens_as_token_ids)")
    return int(key[len(prefix) :])


def post_completion(client: Client, body: dict, attempts: int = 3) -> dict:
    """POST /v1/completions; a dropped connection is retried (the request is idempotent:
    greedy and teacher-forced), an HTTP error is not."""
    for attempt in range(attempts):
        try:
            return client.post_json("/v1/completions", body)
        except (ConnectionError, TimeoutError):
            if attempt == attempts - 1:
                raise
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


def teacher_forced(client: Client, model: str, ids: list[int]) -> dict:
    body = {
        "model": model,
        "prompt": ids,
        "echo": True,
        "logprobs": 1,
        "max_tokens": 1,
        "temperature": 0.0,
        "return_tokens_as_token_ids": True,
    }
    resp = post_completion(client, body)
    lp = resp["choices"][0]["logprobs"]
    n = len(ids)
    values = lp["token_logprobs"][:n]
    tops = lp["top_logprobs"][:n]
    tokens = [_token_id(t) for t in lp["tokens"][:n]]
    if tokens != ids:
        raise ValueError("the server echoed other token ids than it was sent")
    top1 = []
    for entry in tops[1:]:
        if not entry:
            raise ValueError("a prompt position came back without top logprobs")
        key = max(entry, key=entry.get)
        top1.append(_token_id(key))
    return {"prompt_sha256": sha256_ids(ids), "logprobs": values[1:], "top1": top1}


def greedy(
    client: Client, model: str, ids: list[int], max_tokens: int = GREEDY_TOKENS
) -> list[int]:
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    resp = post_completion(client, body)
    tokens = [_token_id(t) for t in resp["choices"][0]["logprobs"]["tokens"]]
    if len(tokens) != max_tokens:
        raise ValueError(f"asked for {max_tokens} greedy tokens, got {len(tokens)}")
    return tokens


def greedy_margins(
    client: Client, model: str, ids: list[int], continuation: list[int]
) -> list[float]:
    """How far each token of ``continuation`` is from the server's own greedy choice: the
    prompt and continuation teacher-forced, and at every continuation position the top-1
    logprob minus the logprob of the token there (0 where it is the top-1). A speculative
    server's greedy output is greedy when these stay within rounding noise: a draft token
    accepted against the target model's choice shows as a margin of its logit gap."""
    full = ids + continuation
    body = {
        "model": model,
        "prompt": full,
        "echo": True,
        "logprobs": 1,
        "max_tokens": 1,
        "temperature": 0.0,
        "return_tokens_as_token_ids": True,
    }
    lp = post_completion(client, body)["choices"][0]["logprobs"]
    if [_token_id(t) for t in lp["tokens"][: len(full)]] != full:
        raise ValueError("the server echoed other token ids than it was sent")
    margins = []
    for i in range(len(ids), len(full)):
        entry, chosen = lp["top_logprobs"][i], lp["token_logprobs"][i]
        if not entry or chosen is None:
            raise ValueError(f"continuation position {i - len(ids)} came back without logprobs")
        margins.append(max(entry.values()) - chosen)
    return margins


def run_all(
    client: Client,
    model: str,
    prompts: dict[str, list[int]],
    schedule: str,
    with_greedy: bool = True,
    concurrency: int = 16,
    check_greedy: bool = False,
) -> dict:
    """Every prompt through both probes. ``sequential``: one request at a time (batch 1);
    ``concurrent``: ``concurrency`` requests in flight (the server batches them). With
    ``check_greedy``, each greedy continuation's ``greedy_margins`` too (``greedy_margin``)."""
    if schedule not in ("sequential", "concurrent"):
        raise ValueError(f"schedule must be sequential or concurrent, got {schedule!r}")
    workers = 1 if schedule == "sequential" else concurrency

    def one(name: str) -> tuple[str, dict]:
        rec = teacher_forced(client, model, prompts[name])
        if with_greedy:
            rec["greedy"] = greedy(client, model, prompts[name])
            if check_greedy:
                rec["greedy_margin"] = greedy_margins(client, model, prompts[name], rec["greedy"])
        return name, rec

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=workers) as pool:
        results = dict(pool.map(one, sorted(prompts)))
    return {"schedule": schedule, "seconds": time.perf_counter() - t0, "prompts": results}
