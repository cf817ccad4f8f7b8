"""What the TileLang sparse-MLA decode A/B benchmarks share: their cases and arguments,
one of arch.py's ``sparse_mla.decode_tilelang`` knobs set for a block of calls, the run's
stack line, the case loop on the TileLang engine, and the JSON report."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

CONFIG = "sparse_mla.decode_tilelang"
SPLIT_MODES = ("latency", "throughput")
WIDTHS = (128, 512)  # SWA window + Top-K rows: V4.1's compressed layers
MIN_REPS = 50


@dataclasses.dataclass(frozen=True)
class AbCase:
    heads: int
    T: int
    splits: str

    @property
    def name(self) -> str:
        return f"H{self.heads}_T{self.T}_{self.splits}"


def ab_parser(description: str, heads: tuple, tokens: tuple) -> argparse.ArgumentParser:
    """--out, --reps, --heads, --tokens, --splits with the benchmark's defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="path of the JSON report")
    parser.add_argument("--reps", type=int, default=MIN_REPS, help=f"timed reps (>= {MIN_REPS})")
    parser.add_argument("--heads", type=int, nargs="+", default=list(heads))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(tokens))
    parser.add_argument("--splits", nargs="+", default=list(SPLIT_MODES), choices=SPLIT_MODES)
    return parser


def check_reps_and_tokens(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.reps < MIN_REPS:
        parser.error(f"--reps: at least {MIN_REPS}, got {args.reps}")
    if any(t <= 0 for t in args.tokens):
        parser.error("--tokens: positive")


def cases(args: argparse.Namespace, case_type: type = AbCase) -> list:
    return [case_type(h, t, s) for s in args.splits for h in args.heads for t in args.tokens]


@contextlib.contextmanager
def decode_constexpr(name: str, value: int) -> Iterator[None]:
    """arch.py's TileLang decode config with ``name`` set to ``value`` for the block's
    calls (launch() and warmup read it per call); restored afterwards."""
    from deepinfer_sm80 import arch

    base = arch.KERNEL_CONFIGS[CONFIG]
    if name not in base.constexpr_dict():
        raise KeyError(f"{CONFIG} has no constexpr {name!r}")
    consts = {**base.constexpr_dict(), name: value}
    arch.KERNEL_CONFIGS[CONFIG] = dataclasses.replace(base, constexprs=tuple(consts.items()))
    try:
        yield
    finally:
        arch.KERNEL_CONFIGS[CONFIG] = base


def stack_line(info: dict) -> str:
    """GPU and versions, as every A/B log's first line states them."""
    return (
        f"{info.get('gpu')} | torch {info['torch']} | triton {info['triton']} | "
        f"tilelang {info['tilelang']} | CUDA {info['cuda_runtime']} | driver {info.get('driver')}"
    )


def start_ab_run(name: str, reps: int):
    """The A/B benchmarks' start on the GPU: ``(device info, CudaTimer of reps)`` after
    printing the stack line and warming the GPU up; None, with the reason on stderr,
    without a CUDA GPU."""
    import sys

    import torch

    from benchmarks.runner import CudaTimer, device_info, warm_up_gpu

    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU", file=sys.stderr)
        return None
    info = device_info()
    print(stack_line(info) + f" | cold L2, CUDA events, {reps} reps interleaved A/B", flush=True)
    warm_up_gpu()
    return info, CudaTimer(reps=reps)


def run_on_tilelang(case_list: list, run_case: Callable, line: Callable, gpu: str) -> list[dict]:
    """``run_case(case)`` for each case with the TileLang decode forced (never a silent
    Triton fallback), printing ``line(row, gpu)`` as each row comes."""
    from benchmarks.runner import restored_env
    from deepinfer_sm80.ops.sparse_mla.engine import DECODE_ENGINE_ENV

    rows = []
    with restored_env(DECODE_ENGINE_ENV):
        os.environ[DECODE_ENGINE_ENV] = "tilelang"
        for case in case_list:
            rows.append(run_case(case))
            print(line(rows[-1], gpu), flush=True)
    return rows


def write_report(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
