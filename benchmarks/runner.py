"""The benchmark runner every suite shares.

A suite registers ``Case``s. For each case the runner builds inputs outside any timed
region, runs the baseline and the candidate side by side in one process on one GPU,
checks the candidate against the baseline **before** timing (bit-exact or the op's
tolerance) and refuses to time or report a speed-up when the check fails. Timings are
medians with p20/p80 of CUDA-event timings with a cold L2 and the host's launch
overhead hidden (``CudaTimer``). Each report also measures, in the same run, the device
copy bandwidth and an empty-kernel launch time, so gates are fractions of this device's
own limits; gates are judged at the candidate's p80 time, not its median.

Output: ``benchmarks/results/<gpu>.json`` (one file per GPU, suites merged into it) and
``benchmarks/results/sm80_benchmark_summary.json`` keyed by GPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SUMMARY_FILE = "sm80_benchmark_summary.json"


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    detail: str


@dataclass(frozen=True)
class Gate:
    """A pass/fail target on the candidate, evaluated from measured numbers.

    ``kind``: ``"floor_ratio_max"`` -- candidate time / device floor (empty-kernel launch
    + bytes at copy bandwidth) must be <= ``value``; ``"bandwidth_fraction_min"`` --
    achieved bytes/s over the measured copy bandwidth must be >= ``value``;
    ``"speedup_min"`` -- baseline time / candidate time must be >= ``value``. The
    candidate's time is its p80 (``_judge``).
    """

    kind: str
    value: float


@dataclass
class Case:
    """One benchmark case.

    ``setup()`` returns the inputs (built outside timing); ``baseline(state)`` and
    ``candidate(state)`` each return their output; ``check(state, base_out, cand_out)``
    compares them. ``bytes_moved(state)`` is the minimum traffic of the op, for GB/s.
    """

    suite: str
    name: str
    params: dict[str, Any]
    setup: Callable[[], Any]
    baseline_name: str
    baseline: Callable[[Any], Any]
    candidate_name: str
    candidate: Callable[[Any], Any]
    check: Callable[[Any, Any, Any], CheckResult]
    bytes_moved: Callable[[Any], int] | None = None
    flops: Callable[[Any], int] | None = None
    gates: list[Gate] = field(default_factory=list)


class Registry:
    def __init__(self) -> None:
        self._cases: list[Case] = []

    def add(self, case: Case) -> Case:
        if any(c.suite == case.suite and c.name == case.name for c in self._cases):
            raise ValueError(f"duplicate benchmark case {case.suite}/{case.name}")
        self._cases.append(case)
        return case

    def cases(self, suite: str | None = None) -> list[Case]:
        return [c for c in self._cases if suite is None or c.suite == suite]


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float


class CudaTimer:
    """Times a callable's GPU work with CUDA events, cold L2, and no host overhead.

    Before each repetition the L2 is flushed (a 256 MiB memset) and the stream is held
    busy by ``torch.cuda._sleep`` while the host enqueues the call, so the events bracket
    only the GPU's work: Python-side argument checks and launch latency on the host
    cannot leak into the figure (they did with plain ``do_bench`` on small ops).
    """

    # Upper bound of GPU cycles per microsecond (H200 boosts to 1.98 GHz, A100 1.41 GHz),
    # so a sleep sized from host time in cycles always lasts at least that long.
    CYCLES_PER_US = 2000

    def __init__(self, reps: int = 200, warmup: int = 10) -> None:
        self.reps = reps
        self.warmup = warmup
        self._flush = None

    def __call__(self, fn: Callable[[], Any]) -> Timing:
        return self.interleaved([fn])[0]

    def interleaved(self, fns: list[Callable[[], Any]]) -> list[Timing]:
        """Time several callables rep by rep in turn (A, B, A, B, ...), each rep as
        ``__call__`` times one, so clock and thermal drift fall on all of them alike."""
        import torch

        if self._flush is None:
            self._flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        host_us: list[list[float]] = [[] for _ in fns]
        for _ in range(self.warmup):
            for fn, spent in zip(fns, host_us, strict=True):
                t0 = time.perf_counter()
                fn()
                spent.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
        # Hold the stream for 3x the host enqueue time (median of the warm calls: the
        # first may include a JIT compile), between 200 us and 50 ms.
        sleep_cycles = []
        for spent in host_us:
            steady = sorted(spent[1:] or spent)[len(spent[1:] or spent) // 2]
            sleep_us = min(max(200.0, 3 * steady), 50_000.0)
            sleep_cycles.append(int(sleep_us * self.CYCLES_PER_US))
        events = [
            [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(self.reps)
            ]
            for _ in fns
        ]
        for rep in range(self.reps):
            for fn, cycles, pairs in zip(fns, sleep_cycles, events, strict=True):
                start, end = pairs[rep]
                self._flush.zero_()
                torch.cuda._sleep(cycles)
                start.record()
                fn()
                end.record()
        torch.cuda.synchronize()
        return [_timing([s.elapsed_time(e) * 1e3 for s, e in pairs]) for pairs in events]


def _timing(times_us: list[float]) -> Timing:
    times = sorted(times_us)
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return Timing(pick(0.5), pick(0.2), pick(0.8))


@contextlib.contextmanager
def restored_env(name: str) -> Iterator[None]:
    """Leave environment variable ``name`` as it was on entry, whatever the block sets it
    to (the engine comparisons switch the kernels' engine variables per run)."""
    previous = os.environ.get(name)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def device_info() -> dict[str, Any]:
    import torch
    import triton

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda_runtime": torch.version.cuda,
    }
    try:
        import tilelang

        info["tilelang"] = tilelang.__version__
    except Exception:  # noqa: BLE001 -- optional on a GPU test machine
        info["tilelang"] = None
    from tools import ampere_ptx

    # DEEPINFER_AMPERE_PTX=1: Triton kernels built as sm_80 PTX, JIT-compiled by the driver.
    info["triton_code"] = ampere_ptx.enable_if_requested() or "native"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
        )
        try:
            import pynvml

            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 -- NVML is optional
            info["driver"] = None
    return info


def warm_up_gpu(seconds: float = 0.5) -> None:
    """Keep the GPU busy so its clocks leave their idle state before anything is timed."""
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def measure_copy_bandwidth_gbs(timer: Callable, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))
    return 2 * nbytes / (t.median_us * 1e-6) / 1e9


def measure_bf16_tflops(timer: Callable, n: int = 8192) -> float:
    """Dense bf16 matmul rate of this device (torch.matmul, n x n x n)."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = timer(lambda: a @ b)
    return 2 * n**3 / (t.median_us * 1e-6) / 1e12


def measure_empty_kernel_us(timer: Callable) -> float:
    """Launch-to-completion time of an empty Triton kernel, as timed by ``timer``."""
    import torch

    from benchmarks._empty_kernel import launch_empty

    x = torch.empty(1, device="cuda")
    launch_empty(x)
    return timer(lambda: launch_empty(x)).median_us


def gpu_slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_") or "unknown_gpu"


def results_key(device: dict[str, Any]) -> str:
    """File/summary key of a report: the GPU, plus the Triton lowering when it is not the
    GPU's own (``DEEPINFER_AMPERE_PTX=1`` figures never mix with native ones)."""
    key = gpu_slug(str(device.get("gpu") or "unknown_gpu"))
    if device.get("triton_code", "native") != "native":
        key += "__" + gpu_slug(str(device["triton_code"]))
    return key


def run_case(
    case: Case,
    timer: Callable,
    copy_gbs: float,
    launch_us: float,
    bf16_tflops: float | None = None,
) -> dict[str, Any]:
    """Check first, then time. A failed check yields no timing and no speed-up."""
    state = case.setup()
    # Candidate first, so a stale correct answer left by the baseline cannot hide a bug.
    cand_out = case.candidate(state)
    base_out = case.baseline(state)
    check = case.check(state, base_out, cand_out)
    row: dict[str, Any] = {
        "suite": case.suite,
        "case": case.name,
        "params": case.params,
        "baseline": case.baseline_name,
        "candidate": case.candidate_name,
        "correct": check.ok,
        "check": check.detail,
    }
    if not check.ok:
        row["status"] = "correctness-failed: not timed, no speed-up reported"
        return row
    t_base = timer(lambda: case.baseline(state))
    t_cand = timer(lambda: case.candidate(state))
    row.update(
        status="ok",
        baseline_us={"median": t_base.median_us, "p20": t_base.p20_us, "p80": t_base.p80_us},
        candidate_us={"median": t_cand.median_us, "p20": t_cand.p20_us, "p80": t_cand.p80_us},
        speedup=t_base.median_us / t_cand.median_us,
    )
    if case.bytes_moved is not None:
        nbytes = case.bytes_moved(state)
        achieved = nbytes / (t_cand.median_us * 1e-6) / 1e9
        floor_us = launch_us + nbytes / (copy_gbs * 1e9) * 1e6
        row.update(
            bytes=nbytes,
            candidate_gbs=achieved,
            fraction_of_copy_bw=achieved / copy_gbs,
            device_floor_us=floor_us,
            floor_ratio=t_cand.median_us / floor_us,
        )
    if case.flops is not None:
        tflops = case.flops(state) / (t_cand.median_us * 1e-6) / 1e12
        row["candidate_tflops"] = tflops
        if bf16_tflops:
            row["fraction_of_bf16_matmul"] = tflops / bf16_tflops
    row["gates"] = [_judge(gate, case, row, t_base, t_cand, copy_gbs) for gate in case.gates]
    return row


def _judge(gate: Gate, case: Case, row, t_base: Timing, t_cand: Timing, copy_gbs: float):
    """A gate judged at the candidate's p80 (the time 80 % of its runs beat), so a
    target met only by a lucky median fails; the baseline stays at its median. The
    median figure is kept beside it."""
    slow = t_cand.p80_us
    if gate.kind == "floor_ratio_max":
        if case.bytes_moved is None:
            value, median = math.inf, math.inf
        else:
            value, median = slow / row["device_floor_us"], row["floor_ratio"]
        passed = value <= gate.value
    elif gate.kind == "bandwidth_fraction_min":
        if case.bytes_moved is None:
            value, median = 0.0, 0.0
        else:
            value = row["bytes"] / (slow * 1e-6) / 1e9 / copy_gbs
            median = row["fraction_of_copy_bw"]
        passed = value >= gate.value
    elif gate.kind == "speedup_min":
        value, median = t_base.median_us / slow, row["speedup"]
        passed = value >= gate.value
    else:
        raise ValueError(f"unknown gate kind {gate.kind!r} in {case.suite}/{case.name}")
    return {
        "kind": gate.kind,
        "target": gate.value,
        "at": "candidate p80",
        "value": value,
        "value_at_median": median,
        "passed": passed,
    }


def run_suite(
    suite: str,
    cases: list[Case],
    timer: Callable | None = None,
    results_dir: Path = RESULTS_DIR,
    info: dict[str, Any] | None = None,
    copy_gbs: float | None = None,
    launch_us: float | None = None,
) -> dict[str, Any]:
    """Run ``cases``, print a progress line each, merge the report into the results."""
    info = info or device_info()  # first: it may switch Triton's lowering (ampere_ptx)
    if timer is None:
        timer = CudaTimer()
        warm_up_gpu()
    copy_gbs = copy_gbs if copy_gbs is not None else measure_copy_bandwidth_gbs(timer)
    launch_us = launch_us if launch_us is not None else measure_empty_kernel_us(timer)
    bf16_tflops = None
    if any(c.flops is not None for c in cases):
        bf16_tflops = measure_bf16_tflops(timer)
    label = (
        f"{info.get('gpu')} | torch {info.get('torch')} | triton {info.get('triton')} | "
        f"CUDA {info.get('cuda_runtime')} | driver {info.get('driver')} | "
        f"Triton code {info.get('triton_code', 'native')}"
    )
    print(f"[{suite}] {label}", flush=True)
    print(f"[{suite}] copy {copy_gbs:.0f} GB/s, empty kernel {launch_us:.2f} us", flush=True)
    if bf16_tflops:
        print(f"[{suite}] dense bf16 matmul {bf16_tflops:.0f} TFLOP/s", flush=True)
    rows = []
    for i, case in enumerate(cases, 1):
        t0 = time.perf_counter()
        row = run_case(case, timer, copy_gbs, launch_us, bf16_tflops)
        rows.append(row)
        print(
            f"[{suite}] {i}/{len(cases)} {_progress(row)} ({time.perf_counter() - t0:.1f}s)",
            flush=True,
        )
    report = {
        "suite": suite,
        "device": info,
        "label": label,
        "copy_bandwidth_gbs": copy_gbs,
        "empty_kernel_us": launch_us,
        "bf16_matmul_tflops": bf16_tflops,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cases": rows,
    }
    write_report(report, results_dir)
    return report


def _progress(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['case']}: {row['status']} ({row['check']})"
    text = (
        f"{row['case']}: {row['candidate_us']['median']:.2f} us vs {row['baseline']} "
        f"{row['baseline_us']['median']:.2f} us ({row['speedup']:.2f}x)"
    )
    if "candidate_gbs" in row:
        text += f", {row['candidate_gbs']:.0f} GB/s ({100 * row['fraction_of_copy_bw']:.0f}% copy)"
    if "candidate_tflops" in row:
        text += f", {row['candidate_tflops']:.1f} TFLOP/s"
        if "fraction_of_bf16_matmul" in row:
            text += f" ({100 * row['fraction_of_bf16_matmul']:.0f}% of matmul)"
    for gate in row["gates"]:
        text += f", gate {gate['kind']} {'PASS' if gate['passed'] else 'FAIL'} at p80"
    return text


def write_report(report: dict[str, Any], results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    gpu = results_key(report["device"])
    path = results_dir / f"{gpu}.json"
    per_gpu = json.loads(path.read_text()) if path.exists() else {"suites": {}}
    per_gpu["device"] = report["device"]
    per_gpu["suites"][report["suite"]] = report
    path.write_text(json.dumps(per_gpu, indent=1, sort_keys=True) + "\n")
    summary_path = results_dir / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary[gpu] = per_gpu
    summary_path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return path


def close_check(base: Any, cand: Any, rel_tol: float) -> CheckResult:
    """Relative Frobenius error of ``cand`` against ``base`` <= rel_tol, no NaN/inf."""
    import torch

    b, c = base.float(), cand.float()
    if not torch.isfinite(c).all():
        return CheckResult(False, "non-finite values in the candidate")
    rel = float((c - b).norm() / b.norm().clamp_min(1e-30))
    return CheckResult(rel <= rel_tol, f"relative error {rel:.2e} (tolerance {rel_tol:.0e})")


def exact_check(base: Any, cand: Any) -> CheckResult:
    """Bit-exact equality of tensors (or tuples of tensors); NaN positions must match."""
    import torch

    bases = base if isinstance(base, tuple | list) else (base,)
    cands = cand if isinstance(cand, tuple | list) else (cand,)
    for i, (b, c) in enumerate(zip(bases, cands, strict=True)):
        if b.shape != c.shape or b.dtype != c.dtype:
            return CheckResult(
                False, f"output {i}: {tuple(c.shape)}/{c.dtype} vs {tuple(b.shape)}/{b.dtype}"
            )
        if b.is_floating_point():
            ib = b.view(torch.int16 if b.element_size() == 2 else torch.int32)
            ic = c.view(ib.dtype)
            diff = (ib != ic) & ~(torch.isnan(b) & torch.isnan(c))
        else:
            diff = b != c
        n = int(diff.sum())
        if n:
            return CheckResult(False, f"output {i}: {n} elements differ")
    return CheckResult(True, "bit-exact")


def main_for_suite(suite: str, registry: Registry) -> int:
    report = run_suite(suite, registry.cases(suite))
    failed = [r["case"] for r in report["cases"] if not r["correct"]]
    gate_failed = [
        r["case"] for r in report["cases"] if any(not g["passed"] for g in r.get("gates", []))
    ]
    if failed:
        print(f"[{suite}] correctness FAILED: {failed}", file=sys.stderr)
    if gate_failed:
        print(f"[{suite}] gates missed: {gate_failed}", file=sys.stderr)
    return 1 if failed else 0
