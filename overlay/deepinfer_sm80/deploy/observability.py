"""The monitoring stack's content, as data: Grafana dashboard panels, Prometheus recording
rules and alerts over the metrics vLLM 0.33.0 serves at ``/metrics``.

One source for every PromQL expression; ``deepinfer observability --write DIR`` renders
the files compose mounts (``configs/observability/``) and a test keeps them current, checks
every metric name against the installed vLLM and runs Prometheus's own ``promtool``.

Metric facts (vLLM 0.33.0, ``v1/metrics/loggers.py`` and ``v1/spec_decode/metrics.py``):
counters are exposed with ``_total``, histograms with ``_bucket``/``_sum``/``_count``;
labels ``model_name`` and ``engine``; the per-position acceptance counter carries
``position`` = 0..K-1. Only the API node serves ``/metrics`` (headless nodes expose nothing),
and it is not behind ``--api-key`` (vLLM guards only /v1, /v2, /inference, /cohere).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

RATE = "$__rate_interval"  # Grafana's scrape-aware window; rules use RULE_WINDOW
RULE_WINDOW = "5m"
MODEL = '{model_name=~"$model_name"}'

# DSpark at K = 5: a healthy server accepts well over a third of the draft tokens (the
# original's mean accepted length was 3+ tokens per step). Below 20 % for ten minutes the
# drafts cost more than they save: the alert says so.
ACCEPTANCE_COLLAPSE = 0.2
KV_NEARLY_FULL = 0.95


@dataclass(frozen=True)
class Panel:
    title: str
    exprs: tuple[tuple[str, str], ...]  # (legend, PromQL with $window and $model)
    unit: str
    description: str
    kind: str = "timeseries"
    extra: dict = field(default_factory=dict)


def _q(expr: str, window: str, model: str) -> str:
    return expr.replace("$window", window).replace("$model", model)


def _quantiles(metric: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (
            f"p{int(q * 100)}",
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket$model[$window])))",
        )
        for q in (0.5, 0.95, 0.99)
    )


ACCEPTED = "sum(rate(vllm:spec_decode_num_accepted_tokens_total$model[$window]))"
DRAFT_TOKENS = "sum(rate(vllm:spec_decode_num_draft_tokens_total$model[$window]))"
DRAFTS = "sum(rate(vllm:spec_decode_num_drafts_total$model[$window]))"

PANELS: tuple[Panel, ...] = (
    Panel(
        "Request rate",
        (
            (
                "{{finished_reason}}",
                "sum by (finished_reason) (rate(vllm:request_success_total$model[$window]))",
            ),
        ),
        "reqps",
        "Finished requests per second, by finish reason (stop, length, abort, ...).",
    ),
    Panel(
        "Time to first token",
        _quantiles("vllm:time_to_first_token_seconds"),
        "s",
        "TTFT quantiles; a 1M-token prefill takes minutes (buckets reach 2,560 s).",
    ),
    Panel(
        "Inter-token latency",
        _quantiles("vllm:inter_token_latency_seconds"),
        "s",
        "Time between output chunks; with DSpark one step can emit up to K+1 tokens.",
    ),
    Panel(
        "KV-cache usage",
        (("usage", "max(vllm:kv_cache_usage_perc$model)"),),
        "percentunit",
        "Fraction of KV blocks in use (1 = full); the alert fires above 95 % for 5 min.",
        extra={"max": 1, "min": 0},
    ),
    Panel(
        "Preemptions",
        (("preemptions/s", "sum(rate(vllm:num_preemptions_total$model[$window]))"),),
        "ops",
        "Requests preempted for lack of KV blocks; sustained preemption means the KV "
        "cache is too small for the load.",
    ),
    Panel(
        "Queue depth",
        (
            ("waiting", "sum(vllm:num_requests_waiting$model)"),
            ("running", "sum(vllm:num_requests_running$model)"),
        ),
        "short",
        "Requests waiting for a slot and requests running.",
    ),
    Panel(
        "Token throughput",
        (
            ("prompt tok/s", "sum(rate(vllm:prompt_tokens_total$model[$window]))"),
            ("generated tok/s", "sum(rate(vllm:generation_tokens_total$model[$window]))"),
        ),
        "short",
        "Prompt tokens processed and tokens generated per second.",
    ),
    Panel(
        "DSpark acceptance per draft position",
        (
            (
                "position {{position}}",
                "sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total"
                "$model[$window])) / on () group_left () (" + DRAFTS + " > 0)",
            ),
        ),
        "percentunit",
        "Share of drafts whose token at this position was accepted; falls with position. "
        "No value while idle (no drafts), not a fake 100 %.",
        extra={"max": 1, "min": 0},
    ),
    Panel(
        "DSpark mean accepted length",
        (("tokens/step", "1 + " + ACCEPTED + " / (" + DRAFTS + " > 0)"),),
        "short",
        "Tokens emitted per verification step, bonus token included (at most K+1 = 6).",
    ),
    Panel(
        "DSpark acceptance rate",
        (("accepted/drafted", ACCEPTED + " / (" + DRAFT_TOKENS + " > 0)"),),
        "percentunit",
        f"Accepted draft tokens over drafted tokens; the alert fires below "
        f"{ACCEPTANCE_COLLAPSE:.0%} for 10 min.",
        extra={"max": 1, "min": 0},
    ),
)

RECORDING_RULES: tuple[tuple[str, str], ...] = (
    ("deepinfer:spec_decode_acceptance_rate:rate5m", ACCEPTED + " / (" + DRAFT_TOKENS + " > 0)"),
    (
        "deepinfer:spec_decode_mean_accepted_length:rate5m",
        "1 + " + ACCEPTED + " / (" + DRAFTS + " > 0)",
    ),
    (
        "deepinfer:spec_decode_acceptance_by_position:rate5m",
        "sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[$window])) "
        "/ on () group_left () (" + DRAFTS + " > 0)",
    ),
    ("deepinfer:kv_cache_usage:max", "max(vllm:kv_cache_usage_perc)"),
)

ALERTS: tuple[dict, ...] = (
    {
        "alert": "DeepInferKVCacheNearlyFull",
        "expr": f"max(vllm:kv_cache_usage_perc) > {KV_NEARLY_FULL}",
        "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "KV cache above 95 % for 5 minutes",
            "description": "New long requests will queue or preempt others. Lower "
            "max_num_seqs, shorten max_model_len, or add a replica.",
        },
    },
    {
        "alert": "DeepInferKVCacheExhausted",
        "expr": "sum(rate(vllm:num_preemptions_total[5m])) > 0 "
        "and on () max(vllm:kv_cache_usage_perc) > 0.98",
        "for": "2m",
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "KV cache full and requests are being preempted",
            "description": "Preempted requests recompute their prefill: throughput collapses.",
        },
    },
    {
        "alert": "DeepInferDSparkAcceptanceCollapse",
        "expr": "(" + ACCEPTED + " / (" + DRAFT_TOKENS + f" > 0)) < {ACCEPTANCE_COLLAPSE}",
        "for": "10m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "DSpark acceptance below 20 % for 10 minutes",
            "description": "Speculation costs more than it saves. Check the draft layers' "
            "outputs (a kernel regression shows here first) or the traffic mix.",
        },
    },
    {
        "alert": "DeepInferDown",
        "expr": 'up{job="deepinfer"} == 0',
        "for": "2m",
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "Prometheus cannot scrape the server's /metrics",
            "description": "The API node is down or unreachable (worker nodes expose no metrics).",
        },
    },
)


def dashboard_exprs() -> list[str]:
    """Every dashboard expression as Prometheus would evaluate it (Grafana variables
    replaced by a plain window and an any-model matcher)."""
    return [_q(e, RULE_WINDOW, '{model_name=~".*"}') for p in PANELS for _, e in p.exprs]


def rule_exprs() -> list[str]:
    return [_q(e, RULE_WINDOW, "") for _, e in RECORDING_RULES] + [
        _q(a["expr"], RULE_WINDOW, "") for a in ALERTS
    ]


def dashboard() -> dict:
    panels = []
    for i, p in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": p.kind,
                "title": p.title,
                "description": p.description,
                "datasource": {"type": "prometheus", "uid": "prometheus"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": p.unit, **p.extra}, "overrides": []},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "expr": _q(expr, RATE, MODEL),
                        "legendFormat": legend,
                    }
                    for j, (legend, expr) in enumerate(p.exprs)
                ],
            }
        )
    return {
        "uid": "deepinfer-sm80",
        "title": "DeepInfer-SM80: DeepSeek-V4.1 on Ampere",
        "tags": ["vllm", "deepinfer"],
        "timezone": "browser",
        "refresh": "10s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "model_name",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "prometheus"},
                    "query": "label_values(vllm:num_requests_running, model_name)",
                    "includeAll": True,
                    "multi": True,
                    "current": {"text": "All", "value": "$__all"},
                }
            ]
        },
        "panels": panels,
    }


def rules() -> dict:
    return {
        "groups": [
            {
                "name": "deepinfer-recording",
                "interval": "15s",
                "rules": [
                    {"record": name, "expr": _q(expr, RULE_WINDOW, "")}
                    for name, expr in RECORDING_RULES
                ],
            },
            {
                "name": "deepinfer-alerts",
                "rules": [{**a, "expr": _q(a["expr"], RULE_WINDOW, "")} for a in ALERTS],
            },
        ]
    }


def render(dest: Path) -> list[Path]:
    """Write the dashboard and the rule file under ``dest`` (configs/observability)."""
    dash = dest / "grafana" / "dashboards" / "deepinfer.json"
    rule_file = dest / "prometheus" / "deepinfer.rules.yml"
    dash.parent.mkdir(parents=True, exist_ok=True)
    rule_file.parent.mkdir(parents=True, exist_ok=True)
    dash.write_text(json.dumps(dashboard(), indent=1) + "\n")
    header = "# Generated by `deepinfer observability --write configs/observability`; edit\n"
    header += "# overlay/deepinfer_sm80/deploy/observability.py instead.\n"
    rule_file.write_text(header + yaml.safe_dump(rules(), sort_keys=False, width=100))
    return [dash, rule_file]
