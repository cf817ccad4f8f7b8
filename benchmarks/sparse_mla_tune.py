"""Sweep sparse-MLA launch configs: time each on this GPU and show its Ampere fitness.

Fitness (sm80/sm86: <= 48 KB shared memory, no spills, 2 CTAs/SM by registers) is
computed ahead of time on any machine with ``--fit`` (writes
``benchmarks/results/sparse_mla_fit.json``); the timing run reads that file, so a
config that does not fit Ampere is visible as such next to its H200 time.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.sparse_mla_tune [--fit]``
"""

import dataclasses
import itertools
import json
import sys
from pathlib import Path

from deepinfer_sm80 import arch

FIT_FILE = Path(__file__).resolve().parent / "results" / "sparse_mla_fit.json"
SWEEP = [
    # (BLOCK_H, BLOCK_N, num_warps, num_stages, maxnreg, PREFETCH)
    *itertools.product([16], [16, 32], [4, 8], [1], [None, 128], [0, 1]),
    *itertools.product([32], [16], [4, 8], [1], [None, 128], [0]),
]


def _name(c):
    return f"H{c[0]} N{c[1]} w{c[2]} s{c[3]} r{c[4]}"


def _fit_name(c):
    return f"{_name(c[:5])} p{c[5]}"


def _with(base: arch.LaunchConfig, c, rows_per_split=None, prefetch=None) -> arch.LaunchConfig:
    consts = {**base.constexpr_dict(), "BLOCK_H": c[0], "BLOCK_N": c[1]}
    if prefetch is not None:
        consts["PREFETCH"] = prefetch
    if rows_per_split:
        consts["ROWS_PER_SPLIT"] = rows_per_split
    return dataclasses.replace(
        base, num_warps=c[2], num_stages=c[3], maxnreg=c[4], constexprs=tuple(consts.items())
    )


def fit() -> None:
    from deepinfer_sm80.ampere_fit import compile_for_ampere, fit_violations
    from deepinfer_sm80.ops.sparse_mla.triton_kernel import ampere_kernel_specs

    base = {s.label: s for s in ampere_kernel_specs()}
    specs = []
    for c in SWEEP:
        for label in ("sparse_mla.decode[swa128+topk512]", "sparse_mla.prefill[640]"):
            s = base[label]
            specs.append(
                dataclasses.replace(
                    s,
                    label=f"{label} {_fit_name(c)}",
                    num_warps=c[2],
                    num_stages=c[3],
                    maxnreg=c[4],
                    constexprs={**s.constexprs, "BLOCK_H": c[0], "BLOCK_N": c[1], "PREFETCH": c[5]},
                )
            )
    reports = compile_for_ampere(specs)
    result = {}
    for r in reports:
        result.setdefault(r.label, []).extend(fit_violations([r]))
    FIT_FILE.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {FIT_FILE}: {sum(not v for v in result.values())} of {len(result)} fit")


TIMED = {
    # config name -> [(BLOCK_H, BLOCK_N, num_warps, num_stages, maxnreg, rows/split, PREFETCH)]
    "sparse_mla.decode": [
        (16, 16, 8, 1, 128, 128, 0),
        (16, 16, 4, 1, None, 64, 0),
        (16, 16, 4, 1, None, 128, 0),
        (16, 16, 4, 1, None, 256, 0),
        (16, 16, 4, 1, None, 640, 0),
        (16, 16, 4, 1, None, 128, 1),
        (16, 16, 4, 1, None, 640, 1),
    ],
    "sparse_mla.prefill": [
        (16, 16, 8, 1, 128, None, 0),
        (16, 16, 4, 1, None, None, 0),
        (16, 16, 4, 1, None, None, 1),
    ],
}
TIMED_CASES = {
    "sparse_mla.decode": [
        f"mla_decode_T{t}_H{h}_w128+512" for h in (64, 32, 8) for t in (1, 16, 256)
    ],
    "sparse_mla.prefill": ["mla_prefill_T1024_H16_ctx16K", "mla_prefill_T1024_H64_ctx16K"],
}


def time_all() -> None:
    from benchmarks.microbench_sparse_mla import build_registry
    from benchmarks.runner import CudaTimer, device_info

    fits = json.loads(FIT_FILE.read_text()) if FIT_FILE.exists() else {}
    info = device_info()
    print(
        f"{info['gpu']} | torch {info['torch']} | triton {info['triton']} | "
        f"Triton code {info['triton_code']}"
    )
    cases = {c.name: c for c in build_registry().cases()}
    timer = CudaTimer(reps=30)
    for cfg_name, configs in TIMED.items():
        label = {
            "sparse_mla.decode": "sparse_mla.decode[swa128+topk512]",
            "sparse_mla.prefill": "sparse_mla.prefill[640]",
        }[cfg_name]
        base = arch.KERNEL_CONFIGS[cfg_name]
        for case_name in TIMED_CASES[cfg_name]:
            case = cases[case_name]
            state = case.setup()
            for c in configs:
                arch.KERNEL_CONFIGS[cfg_name] = _with(base, c[:5], c[5], c[6])
                problems = fits.get(f"{label} {_fit_name(c[:5] + c[6:])}")
                fit_txt = "fits" if problems == [] else ("NO FIT" if problems else "fit ?")
                rps = (f" rows/split {c[5]}" if c[5] else "") + f" prefetch {c[6]}"
                try:
                    t = timer(lambda case=case, state=state: case.candidate(state))
                    print(f"{case_name} {_name(c)}{rps}: {t.median_us:9.1f} us  [{fit_txt}]")
                except Exception as exc:  # noqa: BLE001 -- report and go on with the sweep
                    print(f"{case_name} {_name(c)}: failed {type(exc).__name__}: {exc}"[:200])
                sys.stdout.flush()
            arch.KERNEL_CONFIGS[cfg_name] = base
            del state


if __name__ == "__main__":
    fit() if "--fit" in sys.argv else time_all()
