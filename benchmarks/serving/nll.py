"""Prompt-logprob check: negative log-likelihood of a fixed text set, and an A/B verdict.

Measurement (one server): for every text of ``prompts.nll_texts``, POST /v1/completions with
``echo=true, logprobs=0, max_tokens=0, temperature=0``. vLLM 0.33.0 turns echo + logprobs
into ``prompt_logprobs`` (``CompletionRequest.to_sampling_params``: prompt_logprobs defaults
to logprobs when echo is set) and, with ``max_tokens=0``, returns only the prompt's tokens;
``choices[0].logprobs.token_logprobs`` holds log p(token_i | tokens_<i) of the actual prompt
tokens (logprobs=0 asks for no alternatives), the first one null. A server that refuses
``max_tokens=0`` is asked again with ``max_tokens=1`` and the generated token is dropped.
NLL of a text = -sum of its logprobs; the set's mean NLL = total NLL / total scored tokens.

Run-to-run noise: the set is measured R times (default 3) on the same server, with different
request schedules so that batch composition changes as it does in service: repeat 0 one text
at a time in order, repeat 1 all texts at once, repeat 2 all at once in reverse order, and so
on cyclically. noise(server) = sample standard deviation of the R set means.

Verdict (two servers, e.g. optimizations on and off): delta = mean NLL(A) - mean NLL(B) over
their repeats; noise = max(noise(A), noise(B)); within iff |delta| <= k * noise, k = 3 by
default. A server whose repeats are bit-identical has noise 0; whenever the noise is at or
below the stated absolute floor (default 1e-4 nats/token) the floor stands in for it and the
verdict says so. Texts must
tokenize identically on both servers (same model and tokenizer), else no verdict is given.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics

from benchmarks.serving.client import Client, ServerError
from benchmarks.serving.together import run_together

DEFAULT_K = 3.0
DEFAULT_FLOOR = 1e-4
SCHEDULES = ("sequential", "concurrent", "concurrent-reversed")


def echo_body(model: str, text: str) -> dict:
    return {
        "model": model,
        "prompt": text,
        "echo": True,
        "logprobs": 0,
        "max_tokens": 0,
        "temperature": 0.0,
    }


def score_text(client: Client, model: str, text: str) -> dict:
    body = echo_body(model, text)
    mode = "max_tokens=0"
    try:
        resp = client.post_json("/v1/completions", body)
    except ServerError as exc:
        if exc.status not in (400, 422):
            raise
        resp = client.post_json("/v1/completions", {**body, "max_tokens": 1})
        mode = "max_tokens=1 (generated token dropped)"
    return parse_echo_logprobs(resp) | {"mode": mode}


def parse_echo_logprobs(resp: dict) -> dict:
    choice = resp["choices"][0]
    lp = choice.get("logprobs") or {}
    values = lp.get("token_logprobs")
    if values is None:
        raise ValueError("the server returned no logprobs for an echo=true request")
    n_prompt = (resp.get("usage") or {}).get("prompt_tokens") or len(values)
    values, tokens = values[:n_prompt], (lp.get("tokens") or [])[:n_prompt]
    scored = [v for v in values[1:] if v is not None]
    return {
        "tokens": len(scored),
        "prompt_tokens": n_prompt,
        "nll_sum": -math.fsum(scored),
        "token_logprobs": values[1:],
        "tokens_sha256": hashlib.sha256(json.dumps(tokens).encode()).hexdigest(),
    }


def measure(client: Client, model: str, texts: list[tuple[str, str]], repeats: int) -> dict:
    runs = []
    first: dict[str, dict] = {}
    for r in range(repeats):
        schedule = SCHEDULES[r % len(SCHEDULES)]
        order = list(range(len(texts)))
        if schedule.endswith("reversed"):
            order.reverse()
        results: dict[int, dict] = {}
        if schedule == "sequential":
            for i in order:
                results[i] = score_text(client, model, texts[i][1])
        else:
            results = _concurrent(client, model, texts, order)
        per_text = [
            {"name": texts[i][0], "tokens": results[i]["tokens"], "nll_sum": results[i]["nll_sum"]}
            for i in range(len(texts))
        ]
        runs.append({"schedule": schedule, "per_text": per_text, "mean_nll": _mean(per_text)})
        if r == 0:
            first = {texts[i][0]: results[i] for i in range(len(texts))}
    means = [run["mean_nll"] for run in runs]
    return {
        "texts": [{"name": n, "chars": len(t)} for n, t in texts],
        "mode": next(iter(first.values()))["mode"] if first else None,
        "repeats": runs,
        "mean_nll": statistics.fmean(means),
        "run_std": statistics.stdev(means) if len(means) > 1 else None,
        "tokens_sha256": {n: v["tokens_sha256"] for n, v in first.items()},
        "token_logprobs": {n: v["token_logprobs"] for n, v in first.items()},
    }


def _concurrent(client, model, texts, order) -> dict[int, dict]:
    calls = [lambda i=i: score_text(client, model, texts[i][1]) for i in order]
    return dict(zip(order, run_together(calls), strict=True))


def _mean(per_text: list[dict]) -> float:
    tokens = sum(p["tokens"] for p in per_text)
    return math.fsum(p["nll_sum"] for p in per_text) / tokens if tokens else math.nan


def verdict(a: dict, b: dict, k: float = DEFAULT_K, floor: float = DEFAULT_FLOOR) -> dict:
    """Compare the NLL sections of two result files (A, B); see the module docstring."""
    names_a = [t["name"] for t in a["texts"]]
    names_b = [t["name"] for t in b["texts"]]
    out: dict = {"k": k, "floor": floor}
    if names_a != names_b:
        return out | {"within": None, "text": "not comparable: different text sets"}
    differ = [n for n in names_a if a["tokens_sha256"].get(n) != b["tokens_sha256"].get(n)]
    if differ:
        return out | {
            "within": None,
            "text": f"not comparable: texts tokenize differently on the two servers ({differ[:3]})",
        }
    if a.get("run_std") is None or b.get("run_std") is None:
        return out | {"within": None, "text": "no noise estimate: run at least 2 NLL repeats"}
    delta = a["mean_nll"] - b["mean_nll"]
    noise = max(a["run_std"], b["run_std"])
    used, source = (noise, "run-to-run std") if noise > floor else (floor, "floor")
    threshold = k * used
    within = abs(delta) <= threshold
    per_text = []
    for i, name in enumerate(names_a):
        ta = _text_mean(a, i)
        tb = _text_mean(b, i)
        per_text.append({"name": name, "nll_a": ta, "nll_b": tb, "delta": ta - tb})
    token_delta = _max_token_delta(a.get("token_logprobs") or {}, b.get("token_logprobs") or {})
    why = (
        f"noise = max run-to-run std = {noise:.3g}"
        if source != "floor"
        else f"run-to-run std {noise:.3g} <= floor, so the floor {floor:g} stands in"
    )
    text = (
        f"{'WITHIN' if within else 'OUTSIDE'} the noise: |dNLL| = {abs(delta):.3g} nats/token "
        f"{'<=' if within else '>'} k x noise = {k:g} x {used:.3g} = {threshold:.3g} ({why})"
    )
    return out | {
        "within": within,
        "delta": delta,
        "noise_a": a["run_std"],
        "noise_b": b["run_std"],
        "noise_used": used,
        "noise_source": source,
        "threshold": threshold,
        "per_text": per_text,
        "max_abs_token_logprob_delta": token_delta,
        "text": text,
    }


def _text_mean(section: dict, i: int) -> float:
    vals = [
        run["per_text"][i]["nll_sum"] / run["per_text"][i]["tokens"] for run in section["repeats"]
    ]
    return statistics.fmean(vals)


def _max_token_delta(a: dict, b: dict) -> float | None:
    worst = None
    for name, la in a.items():
        lb = b.get(name)
        if lb is None or len(la) != len(lb):
            continue
        for x, y in zip(la, lb, strict=True):
            if x is None or y is None:
                continue
            d = abs(x - y)
            worst = d if worst is None else max(worst, d)
    return worst
