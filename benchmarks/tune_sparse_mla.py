"""Sweep sparse-MLA launch configs: time each on this GPU and show its Ampere fitness.

Fitness (sm80/sm86: <= 48 KB shared memory, no spills, 2 CTAs/SM by registers) is
computed ahead of time on any machine with ``--fit`` (writes
``benchmarks/results/sparse_mla_fit.json``); the timing run reads that file, so a
config that does not fit Ampere is visible as such next to its H200 time.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.tune_sparse_mla [--fit]``
"""

import dataclasses
import itertools
import json
import sys
from pathlib import Path

from deepinfer_sm80 import arch

FIT_FILE = Path(__file__).resolve().parent / "results" / "sparse_mla_fit.json"
SWEEP = [
    # (BLOCK_H, BLOCK_N, num_warps, num_stages, maxnreg)
    *itertools.product([16], [16, 32, 64], [4, 8], [1, 2], [None, 128]),
    *itertools.product([32, 64], [16, 32], [8], [1], [None]),
]


def _name(c):
    return f"H{c[0]} N{c[1]} w{c[2]} s{c[3]} r{c[4]}"


def _with(base: arch.LaunchConfig, c, rows_per_split=None) -> arch.LaunchConfig:
    consts = {**base.constexpr_dict(), "BLOCK_H": c[0], "BLOCK_N": c[1]}
    if rows_per_split:
        consts["ROWS_PER_SPLIT"] = rows_per_split
    return dataclasses.replace(
        base, num_warps=c[2], num_stages=c[3], maxnreg=c[4], constexprs=tuple(consts.items())
    )


def fit() -> None:
    from deepinfer_sm80.ops.sparse_mla.triton_kernel import ampere_kernel_specs
    from deepinfer_sm80.testing.ampere_fit import compile_for_ampere, fit_violations

    base = {s.label: s for s in ampere_kernel_specs()}
    specs = []
    for c in SWEEP:
        for label in ("sparse_mla.decode[swa128+topk512]", "sparse_mla.prefill[640]"):
            s = base[label]
            specs.append(
                dataclasses.replace(
                    s,
                    label=f"{label} {_name(c)}",
                    num_warps=c[2],
                    num_stages=c[3],
                    maxnreg=c[4],
                    constexprs={**s.constexprs, "BLOCK_H": c[0], "BLOCK_N": c[1]},
                )
            )
    reports = compile_for_ampere(specs)
    result = {}
    for r in reports:
        result.setdefault(r.label, []).extend(fit_violations([r]))
    FIT_FILE.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {FIT_FILE}: {sum(not v for v in result.values())} of {len(result)} fit")


TIMED = [
    # (BLOCK_H, BLOCK_N, num_warps, num_stages, maxnreg, ROWS_PER_SPLIT)
    (16, 16, 8, 1, 128, 256),
    (16, 16, 8, 1, None, 256),
    (16, 16, 8, 1, 128, 64),
    (16, 16, 8, 1, 128, 128),
    (16, 16, 4, 1, None, 256),
]


def time_all() -> None:
    from benchmarks.microbench_sm80_kernels import build_registry
    from benchmarks.runner import CudaTimer, device_info

    fits = json.loads(FIT_FILE.read_text()) if FIT_FILE.exists() else {}
    info = device_info()
    print(f"{info['gpu']} | torch {info['torch']} | triton {info['triton']}")
    cases = {c.name: c for c in build_registry().cases()}
    timer = CudaTimer(reps=50)
    for case_name, cfg_name, label in (
        ("mla_decode_T64_H64_w128+512", "sparse_mla.decode", "sparse_mla.decode[swa128+topk512]"),
        ("mla_decode_T1_H64_w128+512", "sparse_mla.decode", "sparse_mla.decode[swa128+topk512]"),
        ("mla_decode_T256_H64_w128+512", "sparse_mla.decode", "sparse_mla.decode[swa128+topk512]"),
    ):
        case = cases[case_name]
        state = case.setup()
        base = arch.KERNEL_CONFIGS[cfg_name]
        for c in TIMED:
            arch.KERNEL_CONFIGS[cfg_name] = _with(base, c[:5], c[5] if len(c) > 5 else None)
            problems = fits.get(f"{label} {_name(c[:5])}")
            fit_txt = "fits" if problems == [] else ("NO FIT" if problems else "fit ?")
            try:
                t = timer(lambda case=case, state=state: case.candidate(state))
                rps = f" rows/split {c[5]}" if len(c) > 5 else ""
                print(
                    f"{case_name} {_name(c)}{rps}: {t.median_us:9.1f} us  [{fit_txt}]", flush=True
                )
            except Exception as exc:  # noqa: BLE001 -- report and go on with the sweep
                print(f"{case_name} {_name(c)}: failed {type(exc).__name__}: {exc}"[:200])
        arch.KERNEL_CONFIGS[cfg_name] = base


if __name__ == "__main__":
    fit() if "--fit" in sys.argv else time_all()
