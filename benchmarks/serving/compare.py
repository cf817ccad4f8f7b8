"""Result tables: one run's table, and A vs B side by side (``--compare A.json B.json``).

The table has the original's rows (its published headline results): workload, optimized,
baseline; here the columns are the two result files, labelled with their ``--label`` (or
their patch selection), and ``A vs B`` is the relative change of A over B, marked ``+`` when A
is better for that row (higher tok/s, lower time to first token).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.serving import nll
from benchmarks.serving.identity import patch_summary

# The original project's figures (6x GA100 64 GB, TP2 x PP3, DSpark K=5): their hardware and
# their method, shown only as context; ours are measured.
ORIGINAL = {
    "16K cold prefill": (4037.0, 3349.4),
    "64K cold prefill": (4506.8, 3627.3),
    "64K time to first token": (10.7, 13.2),
    "four-stream speculative decode (aggregate)": (170.5, 163.8),
    "single-stream Python-code decode": (160.8, 151.8),
    "GPU-resident KV capacity": (4648480, None),
}


def load(path: str | Path) -> dict:
    data = json.loads(Path(path).read_text())
    if "table" not in data or "server" not in data:
        raise ValueError(f"{path} is not a serving-benchmark result (no 'table'/'server')")
    return data


def fmt(value, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if unit == "tokens" or (isinstance(value, int) and abs(value) >= 1000):
        return f"{value:,.0f}"
    if unit == "s":
        return f"{value:.3f}"
    if unit == "tokens/step":
        return f"{value:.3f}"
    return f"{value:,.1f}"


def _render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| "
        + " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        + " |"
        for r in rows
    ]
    return "\n".join([line, sep, *body])


def label_of(result: dict, default: str) -> str:
    return result["server"].get("label") or default


def format_table(result: dict) -> str:
    rows = [[r["workload"], fmt(r["value"], r["unit"]), r["unit"]] for r in result["table"]]
    head = _identity_line(result, "run")
    return head + "\n" + _render(["workload", label_of(result, "value"), "unit"], rows)


def _identity_line(result: dict, default: str) -> str:
    s = result["server"]
    gpu = s.get("gpu")
    if isinstance(gpu, list):
        gpu = f"{len(gpu)}x {gpu[0]}" if gpu else None
    return (
        f"{label_of(result, default)}: {s.get('model')} | vLLM {s.get('version')} | "
        f"GPU {gpu or 'unknown'} | {patch_summary(s)}"
    )


def relative(a, b, higher_is_better: bool) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    change = (a - b) / abs(b)
    better = (a > b) if higher_is_better else (a < b)
    mark = "+" if better else ("=" if a == b else "-")
    return f"{change * 100:+.1f}% {mark}"


def format_compare(
    a: dict,
    b: dict,
    *,
    with_original: bool = False,
    nll_k: float = nll.DEFAULT_K,
    nll_floor: float = nll.DEFAULT_FLOOR,
) -> str:
    la, lb = label_of(a, "A"), label_of(b, "B")
    if la == lb:
        la, lb = f"A: {la}", f"B: {lb}"
    rows_a = {r["workload"]: r for r in a["table"]}
    rows_b = {r["workload"]: r for r in b["table"]}
    order = list(rows_a) + [w for w in rows_b if w not in rows_a]
    header = ["workload", la, lb, "A vs B"]
    if with_original:
        header += ["original optimized", "original baseline"]
    rows = []
    for w in order:
        ra, rb = rows_a.get(w), rows_b.get(w)
        unit = (ra or rb)["unit"]
        hib = (ra or rb)["higher_is_better"]
        va = ra["value"] if ra else None
        vb = rb["value"] if rb else None
        cells = [f"{w} ({unit})", fmt(va, unit), fmt(vb, unit), relative(va, vb, hib)]
        if with_original:
            oa, ob = ORIGINAL.get(w, (None, None))
            cells += [fmt(x, unit) if x is not None else "-" for x in (oa, ob)]
        rows.append(cells)
    out = [_identity_line(a, "A"), _identity_line(b, "B"), "", _render(header, rows)]
    if with_original:
        out.append(
            "original: the original project's figures on 6x GA100 64 GB (TP2 x PP3, DSpark K=5),"
            " their hardware and method, for context only"
        )
    out += _warnings(a, b)
    out += _acceptance(a, b, la, lb)
    if a.get("nll") and b.get("nll"):
        v = nll.verdict(a["nll"], b["nll"], k=nll_k, floor=nll_floor)
        out += ["", f"Prompt NLL ({len(a['nll']['texts'])} texts):"]
        if v.get("within") is not None:
            out.append(
                f"  {la}: {a['nll']['mean_nll']:.6f}  {lb}: {b['nll']['mean_nll']:.6f} nats/token"
                f"  (run-to-run std {v['noise_a']:.3g} / {v['noise_b']:.3g})"
            )
            if v.get("max_abs_token_logprob_delta") is not None:
                worst = v["max_abs_token_logprob_delta"]
                out.append(f"  largest per-token logprob difference: {worst:.4g}")
        out.append(f"  verdict: {v['text']}")
    return "\n".join(out)


def _warnings(a: dict, b: dict) -> list[str]:
    out = []
    ca, cb = a.get("client", {}), b.get("client", {})
    if ca.get("prompt_material_sha256") != cb.get("prompt_material_sha256"):
        out.append("WARNING: the two runs used different prompt material (sha256 differs)")
    if ca.get("settings") != cb.get("settings"):
        diff = sorted(
            k
            for k in set(ca.get("settings", {})) | set(cb.get("settings", {}))
            if ca.get("settings", {}).get(k) != cb.get("settings", {}).get(k)
        )
        out.append(f"WARNING: benchmark settings differ between the runs: {diff}")
    if a["server"].get("model_root") != b["server"].get("model_root"):
        out.append("WARNING: the two servers serve different model roots")
    return ["", *out] if out else []


def _acceptance(a: dict, b: dict, la: str, lb: str) -> list[str]:
    out = []
    for name in ("code_decode", "spec_decode_4stream", "long_generation"):
        sa = (a.get("workloads", {}).get(name) or {}).get("spec_decode") or {}
        sb = (b.get("workloads", {}).get(name) or {}).get("spec_decode") or {}
        if "acceptance_per_position" not in sa and "acceptance_per_position" not in sb:
            continue
        pa, pb = sa.get("acceptance_per_position") or [], sb.get("acceptance_per_position") or []
        n = max(len(pa), len(pb))
        header = ["acceptance", *[f"pos {i}" for i in range(n)], "mean accepted length"]
        rows = []
        for lab, p, s in ((la, pa, sa), (lb, pb, sb)):
            cells = [f"{i:.3f}" for i in p] + ["n/a"] * (n - len(p))
            rows.append([lab, *cells, fmt(s.get("mean_accepted_length"), "tokens/step")])
        out += ["", f"DSpark acceptance per draft position, {name} (from /metrics deltas):"]
        out.append(_render(header, rows))
    return out
