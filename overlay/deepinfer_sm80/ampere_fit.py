"""Ampere fitness: compile shipped Triton kernel configs for sm_80/sm_86 on any machine.

No GPU is needed. Each ``KernelSpec`` names a ``@triton.jit`` kernel, its argument
types and the constexprs and launch parameters we ship; ``compile_for_ampere`` builds
it through Triton's own launcher for ``GPUTarget("cuda", cc, 32)``
(``triton_launch_compile``: the cache entry a server's launch looks up) and runs the
ptxas bundled with Triton on the PTX to read registers and spills. ``fit_violations``
turns the reports into human-readable failures: shared memory over 48 KB per CTA, any
spill, or a failed compile (an ``fp8e4nv`` type, for instance, which Triton rejects
below sm_89).

Compilation runs in a subprocess with ``TRITON_INTERPRET`` removed: a process that
runs kernels under the interpreter holds interpreter objects, not compilable ones.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict

from deepinfer_sm80.arch import (
    AMPERE_CCS,
    RESERVED_SMEM_PER_BLOCK_BYTES,
    STATIC_SMEM_LIMIT_BYTES,
    arch_limits,
    ptxas_arch,
)
from deepinfer_sm80.kernel_spec import FitReport, KernelSpec

# What ``ptxas -v`` prints (read for Triton kernels here and TileLang kernels in
# ``tilelang_build``).
PTXAS_REGS = re.compile(r"Used (\d+) registers")
PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _compile_one(spec: KernelSpec, cc: int) -> FitReport:
    from triton.backends.nvidia.compiler import get_ptxas

    from deepinfer_sm80.triton_launch_compile import compile_as_launched

    arch = f"sm_{cc}"
    try:
        compiled = compile_as_launched(spec, cc)
        with tempfile.TemporaryDirectory() as tmp:
            ptx = os.path.join(tmp, "k.ptx")
            with open(ptx, "w") as f:
                f.write(compiled.asm["ptx"])
            ptxas = get_ptxas(cc).path
            run = subprocess.run(
                [
                    ptxas,
                    "-v",
                    f"--gpu-name={ptxas_arch(cc)}",
                    ptx,
                    "-o",
                    os.path.join(tmp, "k.cubin"),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
        if run.returncode != 0:
            raise RuntimeError(f"ptxas failed: {run.stderr.strip()}")
        regs = PTXAS_REGS.search(run.stderr)
        spill = PTXAS_SPILL.search(run.stderr)
        if regs is None or spill is None:
            raise RuntimeError(f"could not parse ptxas -v output: {run.stderr.strip()}")
        return FitReport(
            spec.label,
            arch,
            int(compiled.metadata.shared),
            int(regs.group(1)),
            int(spill.group(1)),
            int(spill.group(2)),
            threads=32 * spec.num_warps,
            min_ctas_per_sm=spec.min_ctas_per_sm,
        )
    except Exception as exc:  # noqa: BLE001 -- every failure becomes a report line
        msg = f"{type(exc).__name__}: {exc}"
        return FitReport(spec.label, arch, None, None, None, None, error=msg[:2000])


def _compile_in_this_process(specs: list[KernelSpec], ccs: list[int]) -> list[FitReport]:
    return [_compile_one(spec, cc) for spec in specs for cc in ccs]


def compile_for_ampere(
    specs: list[KernelSpec], ccs: list[int] | None = None, timeout_s: float = 900
) -> list[FitReport]:
    """Compile every spec for every compute capability (default 80 and 86)."""
    if ccs is None:
        ccs = list(AMPERE_CCS)
    payload = json.dumps({"specs": [asdict(s) for s in specs], "ccs": ccs})
    return run_compile_subprocess("deepinfer_sm80.ampere_fit", payload, timeout_s)


def run_compile_subprocess(
    module: str,
    payload: str,
    timeout_s: float,
    what: str = "AOT compile",
    extra_env: dict[str, str] | None = None,
) -> list[FitReport]:
    """Run ``python -m module`` with ``payload`` on stdin and read the FitReports it prints
    as JSON on its last stdout line. ``TRITON_INTERPRET`` is removed: a process that
    imported Triton under the interpreter cannot compile for a GPU target."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(extra_env or {})
    run = subprocess.run(
        [sys.executable, "-m", module],
        input=payload,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"{what} subprocess failed:\n{run.stderr[-4000:]}")
    return [FitReport(**r) for r in json.loads(run.stdout.strip().splitlines()[-1])]


REGISTERS_PER_SM = 65536  # sm80 and sm86 alike


def report_problems(
    reports: list[FitReport], budget_problems: Callable[[FitReport], list[str]]
) -> list[str]:
    """One line per problem, ``"<label> on <arch>: ..."``: a failed compile, or what
    ``budget_problems`` finds in a compiled report followed by any register spill."""
    problems = []
    for r in reports:
        if r.error is not None:
            found = [f"compile failed: {r.error}"]
        else:
            found = budget_problems(r)
            if r.spill_store_bytes or r.spill_load_bytes:
                found.append(
                    f"spills ({r.spill_store_bytes} B stores, "
                    f"{r.spill_load_bytes} B loads) at {r.registers} registers"
                )
        problems += [f"{r.label} on {r.arch}: {p}" for p in found]
    return problems


def fit_violations(
    reports: list[FitReport], smem_limit: int = STATIC_SMEM_LIMIT_BYTES
) -> list[str]:
    """Every way the reports miss the Ampere budget, one line each (empty = fits): per
    CTA, shared memory (``smem_limit``, or for a report marked ``smem_optin`` the
    architecture's opt-in limit per block) and registers; per SM, ``min_ctas_per_sm``
    CTAs' registers and shared memory (each CTA's plus the driver's reserved KB) on the
    report's architecture (``arch.arch_limits``)."""

    def over_budget(r: FitReport) -> list[str]:
        found = []
        limit = arch_limits(r.arch).optin_smem_per_block_bytes if r.smem_optin else smem_limit
        if r.shared_bytes > limit:
            found.append(
                f"{r.shared_bytes} B shared memory > {limit} B"
                + (f" ({r.arch}'s opt-in limit per block)" if r.smem_optin else "")
            )
        sm_smem = arch_limits(r.arch).smem_per_sm_bytes
        per_sm = r.min_ctas_per_sm * (r.shared_bytes + RESERVED_SMEM_PER_BLOCK_BYTES)
        if per_sm > sm_smem:
            found.append(
                f"{r.min_ctas_per_sm} CTAs per SM x ({r.shared_bytes} B + "
                f"{RESERVED_SMEM_PER_BLOCK_BYTES} B reserved) = {per_sm} B shared memory > the "
                f"SM's {sm_smem} B"
            )
        if r.min_ctas_per_sm * r.registers * r.threads > REGISTERS_PER_SM:
            found.append(
                f"{r.registers} registers x {r.threads} threads leaves no room for "
                f"{r.min_ctas_per_sm} CTAs per SM ({REGISTERS_PER_SM} registers)"
            )
        return found

    return report_problems(reports, over_budget)


def format_reports(reports: list[FitReport]) -> str:
    lines = [f"{'kernel':32} {'arch':6} {'smem B':>8} {'regs':>5} {'spill':>6}"]
    for r in reports:
        if r.error:
            lines.append(f"{r.label:32} {r.arch:6} ERROR {r.error.splitlines()[0][:80]}")
        else:
            spill = r.spill_store_bytes + r.spill_load_bytes
            lines.append(f"{r.label:32} {r.arch:6} {r.shared_bytes:>8} {r.registers:>5} {spill:>6}")
    return "\n".join(lines)


def _main() -> None:
    request = json.loads(sys.stdin.read())
    specs = [
        KernelSpec(**{**s, "ints_divisible_by_16": tuple(s["ints_divisible_by_16"])})
        for s in request["specs"]
    ]
    reports = _compile_in_this_process(specs, request["ccs"])
    print(json.dumps([asdict(r) for r in reports]))


if __name__ == "__main__":
    _main()
