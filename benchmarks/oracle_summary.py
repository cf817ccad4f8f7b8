"""One table per kind of upstream oracle, from the records ``tests/ops/test_gpu_oracles.py``
writes where DEEPINFER_ORACLE_RECORD names a JSON-lines file.

    python -m benchmarks.oracle_summary benchmarks/results/NVIDIA_H100.gpu_oracles.jsonl

Each figure below is a field of one record (the record's ``case`` names it); nothing is
computed here but ratios' extremes. Records from the first CPU rehearsal on are left out:
where a CPU rehearsal of the oracle tests appended to the file, its stand-ins' figures
follow (cases named ``rehearsal``, then repeats of earlier cases), and they are no
oracle's. The tests own the verdicts (ours within 1.5x of FlashMLA's error against fp64,
DeepGEMM's logits within the per-element bound, bytes equal); this only lays the numbers
out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: Path) -> list[dict]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON record ({exc})") from None
    if not out:
        raise ValueError(f"{path}: no records")
    return out


def published(recs: list[dict]) -> tuple[list[dict], int]:
    """The records before the first rehearsal, and how many were left out."""
    for i, r in enumerate(recs):
        if "rehearsal" in r.get("case", ""):
            return recs[:i], len(recs) - i
    return recs, 0


def _attention(recs: list[dict]) -> list[str]:
    rows = [r for r in recs if "rel_norm_ratio" in r and "bit_equal" not in r]
    if not rows:
        return []
    lines = [
        "FlashMLA sparse decode/prefill (vLLM's wheel) and ours on the same fp8 records, "
        "indices and sinks; errors against fp64",
        f"{'case':<32} {'ours rel':>10} {'FlashMLA rel':>12} {'ratio':>7} "
        f"{'max-abs ratio':>13} {'ours-vs-oracle worst/bound':>26}",
    ]
    for r in rows:
        lines.append(
            f"{r['case']:<32} {r['ours_vs_fp64']['rel_norm']:>10.4g} "
            f"{r['oracle_vs_fp64']['rel_norm']:>12.4g} {r['rel_norm_ratio']:>7.4f} "
            f"{r['max_abs_ratio']:>13.4f} "
            f"{r['ours_vs_oracle']['worst_element_vs_bound']:>26.4f}"
        )
    ratios = [r["rel_norm_ratio"] for r in rows]
    lines.append(
        f"{len(rows)} cases: rel-norm ratio {min(ratios):.4f}-{max(ratios):.4f} (limit 1.5), "
        f"max-abs ratio at most {max(r['max_abs_ratio'] for r in rows):.4f}"
    )
    return lines


def _logits(recs: list[dict]) -> list[str]:
    rows = [r for r in recs if "worst_vs_bound" in r]
    if not rows:
        return []
    lines = [
        "DeepGEMM fp8 MQA logits (plain prefill, paged decode) against our indexer logits: "
        "worst element over its bound (pass <= 1)",
        f"{'case':<36} {'ours':>8} {'DeepGEMM':>9}",
    ]
    lines += [
        f"{r['case']:<36} {r['worst_vs_bound']:>8.4f} {r['oracle_worst']:>9.4f}" for r in rows
    ]
    return lines


def _mhc(recs: list[dict]) -> list[str]:
    fused = [r for r in recs if "residual_cur" in r]
    post = [r for r in recs if "bit_equal" in r]
    lines = []
    if fused:
        lines += [
            "vLLM's TileLang mHC (mhc_fused_post_pre) against ours: residual's rel-norm error "
            "to fp64, ours over vLLM's; layer input's rel-norm error to fp64, ours and vLLM's "
            "(PyTorch bf16's for scale); fp32 coefficients' max |ours - vLLM|",
            f"{'case':<82} {'residual':>8} {'input ours':>10} {'vLLM':>8} {'torch':>8} "
            f"{'post':>8} {'comb':>8} {'pre':>8}",
        ]
        for r in fused:
            li = r["layer_input"]
            lines.append(
                f"{r['case']:<82} {r['residual_cur']['rel_norm_ratio']:>8.4f} "
                f"{li['ours_vs_fp64']['rel_norm']:>10.2g} {li['oracle_vs_fp64']['rel_norm']:>8.2g} "
                f"{li['ours_vs_oracle']['torch_rel_norm']:>8.2g} "
                f"{r['post']['max_abs_vs_oracle']:>8.2g} {r['comb']['max_abs_vs_oracle']:>8.2g} "
                f"{r['next_pre']['max_abs_vs_oracle']:>8.2g}"
            )
    if post:
        lines += ["vLLM's mhc_post against ours: elements bit-equal, rel-norm ratio to fp64"]
        lines += [
            f"{r['case']:<16} {r['bit_equal']:>10}/{r['elements']:<10} {r['rel_norm_ratio']:.6f}"
            for r in post
        ]
    return lines


def _bytes(recs: list[dict]) -> list[str]:
    writers = [r for r in recs if "bytes_equal" in r]
    gather = [r for r in recs if "elements_bit_equal" in r]
    lines = []
    if writers:
        lines += ["vLLM's cache writers and KV insert on the GPU against ours: bytes equal"]
        lines += [f"{r['case']:<44} {r['bytes_equal']:>9}" for r in writers]
    if gather:
        lines += ["vLLM's gather (its dispatch) against ours: elements bit-equal"]
        lines += [
            f"{r['case']:<48} {r['vllm_dispatch']:<7} {r['elements_bit_equal']:>9}" for r in gather
        ]
    return lines


def render(recs: list[dict], source: str) -> str:
    recs, rehearsals = published(recs)
    gpus = sorted({r.get("gpu", "?") for r in recs})
    out = [f"# {len(recs)} oracle records from {source}, on {', '.join(gpus)}"]
    if rehearsals:
        out.append(f"# left out: the last {rehearsals} records, written by CPU rehearsals")
    for section in (_attention, _logits, _mhc, _bytes):
        lines = section(recs)
        if lines:
            out += ["", *lines]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.oracle_summary", description=__doc__)
    p.add_argument("records", type=Path, help="the JSON-lines file the oracle tests wrote")
    args = p.parse_args(argv)
    try:
        recs = load(args.records)
    except (OSError, ValueError) as exc:
        print(f"oracle_summary: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(recs, args.records.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
