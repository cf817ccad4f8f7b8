"""How far two servers' outputs are apart, and whether that is within the stock path's noise.

Inputs are the probes' records (``probes.py``): per prompt, the teacher-forced logprob of
every prompt token after the first, the top-1 token at every position, and a greedy
continuation. Everything here is pure Python so it is tested without a GPU.

The bound. Two runs of the *stock* path that differ only in how work is batched or
launched (one prompt at a time against sixteen at once; eager against CUDA graphs; another
prefill chunk size) disagree by some amount: that is the noise of bf16 arithmetic in a
different order, and no reference can be closer to the stock path than the stock path is
to itself. The bound is ``factor`` times the largest such disagreement, per statistic
(the per-prompt maximum |delta logprob| and the per-prompt mean |delta logprob|), with an
absolute floor for the case where the stock path is bit-identical with itself. A third
statistic pools every position: the position-weighted mean |delta logprob| over all
prompts. Its noise averages out over the hundreds of thousands of positions, so the
stock path's variations agree on it to about 1.5% and its bound can be tight
(``AGGREGATE_FACTOR``): it resolves a change the per-prompt statistics, which short
prompts make noisy, cannot. A candidate passes when every prompt is within the bound on
both per-prompt statistics and the pooled mean is within its own. Negative controls (the
same checkpoint with one attention layer changed) show which changes the bound resolves.

The systematic deviation. Most of |delta logprob| is rounding: the final logits are bf16,
so whenever anything upstream rounds differently, each logit moves by about an ulp (on
the smoke checkpoint every position differs, by 0.019 nats on average, even between two
batchings of the stock path). That floor hides a change of the model whose own effect is
smaller, whatever statistic of |delta| is taken. But rounding in another batch is a fresh
draw, while a change of the model moves every position the same way in every batch. So
with the same two paths compared twice, one request at a time and sixteen at once, the
pooled covariance of the two deltas, mean((x1 - y1)(x2 - y2)), keeps only what repeats:
the systematic part, reported as a signed root mean square in nats
(``systematic_deviation``). The stock path's own systematic differences (eager against
CUDA graphs, 8,192- against 2,048-token prefill chunks: other kernels and fusions, so
other rounding that repeats) give its bound, ``factor`` times the worst, never below
``SYSTEMATIC_FLOOR``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

DEFAULT_FACTOR = 2.0
# The pooled mean's factor. On the conditioned smoke checkpoint (H200, 267,425 positions)
# the stock path's four variations pooled 0.01926-0.01954 nats: 1.1 leaves about seven
# times that spread.
AGGREGATE_FACTOR = 1.1
# Bounds never go below these (nats): a bit-identical stock path gives no scale of its own.
MAX_FLOOR = 0.02
MEAN_FLOOR = 0.002
SYSTEMATIC_FLOOR = 0.002


@dataclass(frozen=True)
class PromptDelta:
    prompt: str
    positions: int
    max_abs: float
    mean_abs: float
    top1_agreement: float  # fraction of positions whose argmax token is the same
    first_greedy_divergence: int | None  # None: the continuations are equal


def _check_same_prompt(name: str, a: dict, b: dict) -> None:
    if a.get("prompt_sha256") != b.get("prompt_sha256"):
        raise ValueError(f"prompt {name!r}: the two runs scored different token sequences")
    if len(a["logprobs"]) != len(b["logprobs"]):
        raise ValueError(
            f"prompt {name!r}: {len(a['logprobs'])} against {len(b['logprobs'])} logprobs"
        )


def first_divergence(a: list[int] | None, b: list[int] | None) -> int | None:
    """Index of the first differing generated token; None when equal (or not measured)."""
    if a is None or b is None:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def prompt_delta(name: str, a: dict, b: dict) -> PromptDelta:
    _check_same_prompt(name, a, b)
    diffs = []
    for x, y in zip(a["logprobs"], b["logprobs"], strict=True):
        if x is None or y is None:
            raise ValueError(f"prompt {name!r}: a position has no logprob")
        if not (math.isfinite(x) and math.isfinite(y)):
            diffs.append(math.inf)  # a NaN/inf logprob is a failure, never noise
        else:
            diffs.append(abs(x - y))
    n = len(diffs)
    agree = sum(1 for x, y in zip(a["top1"], b["top1"], strict=True) if x == y)
    return PromptDelta(
        prompt=name,
        positions=n,
        max_abs=max(diffs, default=0.0),
        mean_abs=math.fsum(diffs) / n if n else 0.0,
        top1_agreement=agree / n if n else 1.0,
        first_greedy_divergence=first_divergence(a.get("greedy"), b.get("greedy")),
    )


def compare_runs(a: dict, b: dict) -> list[PromptDelta]:
    """Per-prompt deltas between two runs (``{"prompts": {name: record}}``)."""
    names_a, names_b = set(a["prompts"]), set(b["prompts"])
    if names_a != names_b:
        missing = sorted(names_a ^ names_b)
        raise ValueError(f"the runs scored different prompt sets (differ in {missing[:5]})")
    return [prompt_delta(n, a["prompts"][n], b["prompts"][n]) for n in sorted(names_a)]


def summarize(deltas: list[PromptDelta]) -> dict:
    if not deltas:
        raise ValueError("no prompts to compare")
    diverged = [d.first_greedy_divergence for d in deltas if d.first_greedy_divergence is not None]
    return {
        "prompts": len(deltas),
        "positions": sum(d.positions for d in deltas),
        "max_abs": max(d.max_abs for d in deltas),
        "worst_prompt_mean_abs": max(d.mean_abs for d in deltas),
        "mean_abs": math.fsum(d.mean_abs * d.positions for d in deltas)
        / max(1, sum(d.positions for d in deltas)),
        "top1_agreement": math.fsum(d.top1_agreement * d.positions for d in deltas)
        / max(1, sum(d.positions for d in deltas)),
        "greedy_equal_prompts": len(deltas) - len(diverged),
        "first_greedy_divergence": min(diverged) if diverged else None,
    }


@dataclass(frozen=True)
class Bound:
    max_abs: float
    mean_abs: float
    aggregate_mean_abs: float  # the pooled mean over every prompt's positions
    factor: float
    sources: dict  # variation name -> its summary
    # The systematic deviation's bound (nats), None where no variation of the stock path
    # was measured in both schedules; ``systematic_sources``: variation name -> its value.
    systematic: float | None = None
    systematic_sources: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def bound_from_variation(
    variations: dict[str, list[PromptDelta]],
    factor: float = DEFAULT_FACTOR,
    systematic: dict[str, dict] | None = None,
) -> Bound:
    """The bound from the stock path's disagreements with itself (at least one needed);
    ``systematic``: the stock path's systematic deviations (``systematic_deviation``) by
    name, where measured."""
    if not variations:
        raise ValueError("the bound needs at least one variation of the stock path")
    worst_max = max(max(d.max_abs for d in ds) for ds in variations.values())
    worst_mean = max(max(d.mean_abs for d in ds) for ds in variations.values())
    sources = {name: summarize(ds) for name, ds in variations.items()}
    worst_pooled = max(s["mean_abs"] for s in sources.values())
    if not (math.isfinite(worst_max) and math.isfinite(worst_mean)):
        raise ValueError("the stock path produced a non-finite logprob: no bound can be taken")
    sys_bound = None
    if systematic:
        worst_sys = max(v["rms"] for v in systematic.values())
        if not math.isfinite(worst_sys):
            raise ValueError("the stock path's systematic deviation is not finite")
        sys_bound = max(factor * worst_sys, SYSTEMATIC_FLOOR)
    return Bound(
        max_abs=max(factor * worst_max, MAX_FLOOR),
        mean_abs=max(factor * worst_mean, MEAN_FLOOR),
        aggregate_mean_abs=max(AGGREGATE_FACTOR * worst_pooled, MEAN_FLOOR),
        factor=factor,
        sources=sources,
        systematic=sys_bound,
        systematic_sources=dict(systematic) if systematic else None,
    )


def _position_deltas(a: dict, b: dict) -> list[float]:
    """a - b at every position of every prompt (by name), inf where either is not finite."""
    if set(a["prompts"]) != set(b["prompts"]):
        raise ValueError("the runs scored different prompt sets")
    out = []
    for name in sorted(a["prompts"]):
        pa, pb = a["prompts"][name], b["prompts"][name]
        _check_same_prompt(name, pa, pb)
        for x, y in zip(pa["logprobs"], pb["logprobs"], strict=True):
            ok = x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
            out.append(x - y if ok else math.inf)
    return out


def systematic_deviation(x1: dict, y1: dict, x2: dict, y2: dict) -> dict:
    """What repeats of x's difference from y across two independent pairs of runs (x1 and
    y1 in one schedule, x2 and y2 in another): the pooled covariance
    c = mean((x1 - y1)(x2 - y2)) over every position, as ``rms`` = sign(c) sqrt(|c|) in
    nats (inf where a logprob is not finite). Rounding noise that differs between the
    schedules averages out of c; a change of the model, the same in both, does not."""
    d1, d2 = _position_deltas(x1, y1), _position_deltas(x2, y2)
    if len(d1) != len(d2) or not d1:
        raise ValueError(f"the two pairs have {len(d1)} and {len(d2)} positions")
    if not all(map(math.isfinite, d1 + d2)):
        return {"cov": math.inf, "rms": math.inf, "positions": len(d1)}
    cov = math.fsum(a * b for a, b in zip(d1, d2, strict=True)) / len(d1)
    return {"cov": cov, "rms": math.copysign(math.sqrt(abs(cov)), cov), "positions": len(d1)}


def verdict(deltas: list[PromptDelta], bound: Bound, systematic: dict | None = None) -> dict:
    """Within the bound on every prompt, on both per-prompt statistics, within the pooled
    bound and, where ``systematic`` (this pair's ``systematic_deviation``) and its bound
    were both measured, within the systematic bound; names the prompts that are not."""
    outside = [
        {"prompt": d.prompt, "max_abs": d.max_abs, "mean_abs": d.mean_abs}
        for d in deltas
        if not (d.max_abs <= bound.max_abs and d.mean_abs <= bound.mean_abs)
    ]
    summary = summarize(deltas)
    pooled_within = summary["mean_abs"] <= bound.aggregate_mean_abs  # False for NaN too
    judged = systematic is not None and bound.systematic is not None
    systematic_within = bool(systematic["rms"] <= bound.systematic) if judged else None
    return {
        "within": not outside and pooled_within and systematic_within is not False,
        "pooled_within": pooled_within,
        "systematic": systematic,
        "systematic_within": systematic_within,
        "bound": {
            "max_abs": bound.max_abs,
            "mean_abs": bound.mean_abs,
            "aggregate_mean_abs": bound.aggregate_mean_abs,
            "systematic": bound.systematic,
        },
        "outside": outside,
        "summary": summary,
    }


def greedy_check(prompts: dict, bound: Bound) -> dict:
    """Whether a speculative server's greedy continuations are its own greedy choices:
    every continuation token's margin (``probes.greedy_margins``: top-1 logprob minus its
    logprob, teacher-forced on the same server) within ``bound.max_abs``, the largest
    logprob change the stock path's own batching and launch order make. Speculation with
    greedy verification changes only how the target model's choices are batched, so its
    output may part from a non-speculative run's at a near-tie, as two batchings of the
    stock path do, but never at a token the target model ranks clearly below its top-1."""
    margins = {n: p.get("greedy_margin") for n, p in prompts.items()}
    absent = sorted(n for n, m in margins.items() if m is None)
    if absent or not margins:
        return {"greedy": False, "why": f"no greedy margins for {absent or 'any prompt'}"}
    # NaN first, so that a NaN margin is the prompt's worst (max() would skip past it).
    worst = {n: max(m, default=0.0, key=lambda x: (math.isnan(x), x)) for n, m in margins.items()}
    over = {n: w for n, w in worst.items() if not w <= bound.max_abs}
    positions = sum(len(m) for m in margins.values())
    return {
        "greedy": not over,
        "why": f"{len(over)} of {len(margins)} prompts have a token more than "
        f"{bound.max_abs:.4g} nats below the top-1"
        if over
        else f"every token of {positions} within {bound.max_abs:.4g} nats of the top-1",
        "max_margin": max(worst.values()),
        "positions": positions,
        "nonzero_margins": sum(1 for m in margins.values() for x in m if x > 0),
        "outside": over,
    }
