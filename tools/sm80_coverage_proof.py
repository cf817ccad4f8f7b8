"""The proof that what the SM80 coverage walk leaves on DeepSeek-V4.1's path fits Ampere.

``sm80_coverage`` says which kernels and ops are on the path; this module checks them:

- Triton kernels compile ahead of time for sm_80 and sm_86 (``ampere_fit``) at the
  configs they are launched with: ours from their package's ``ampere_kernel_specs()``,
  within 48 KB of shared memory per CTA and without spills; vLLM's from the launch table
  (``sm80_launch_configs``), within the arch's opt-in shared memory (``arch.ArchLimits``).
  Reports are cached per spec, keyed by the spec, the kernel's source and the vLLM and
  Triton versions, so a repeated run compiles only what changed.
- vLLM's TileLang kernels compile ahead of time for sm_80 and sm_86 with an explicit
  TileLang target at the specializations V4.1 compiles (the TileLang table in
  ``sm80_launch_configs``), within the arch's opt-in shared memory, without spills and
  within the register file; cached like the Triton reports.
- Library custom ops have device code for sm_80 and sm_86 in the shared library that
  defines them (``cubin_inventory``).
- ``coverage_report`` lists every kernel and op found, with what became of it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

from deepinfer_sm80.ampere_fit import (
    REGISTERS_PER_SM,
    compile_for_ampere,
    fit_violations,
    report_problems,
    run_compile_subprocess,
)
from deepinfer_sm80.arch import AMPERE_ARCHES, AMPERE_CCS
from deepinfer_sm80.kernel_spec import FitReport, KernelSpec
from tools import cubin_inventory as inventory
from tools import sm80_launch_configs as table
from tools.sm80_coverage import (
    PYTHON_OP_NAMESPACES,
    Coverage,
    KernelSite,
    SourceIndex,
    Walk,
)

# ---------------------------------------------------------------------------------------
# Triton kernels: specs, compilation (cached), limits


def kernel_params(kernel: KernelSite) -> list[tuple[str, bool, str | None]]:
    return [(p.name, p.is_constexpr, p.default) for p in kernel.params]


KNOWN_GAP = "known-gap"


def known_gaps(coverage: Coverage) -> dict[str, KernelSite]:
    """Allowlisted kernels that fail on SM8x today: compiled to show they still do."""
    listed = coverage.allowlist.kernels
    return {
        k: v
        for k, v in coverage.kernels_on_path.items()
        if k in listed and listed[k].category == KNOWN_GAP
    }


def aot_specs(coverage: Coverage) -> tuple[list[KernelSpec], list[str]]:
    """KernelSpecs for every kernel to check (and every known gap), and what keeps one
    from having specs: a vLLM kernel with no (or a wrong) launch table entry, a kernel of
    ours whose package ships no spec for it, a kernel this test cannot compile."""
    specs: list[KernelSpec] = []
    problems: list[str] = []
    wanted = {**coverage.kernels_to_check, **known_gaps(coverage)}
    for kid, kernel in sorted(wanted.items()):
        if kernel.kind == "tilelang" and not kernel.is_ours:
            problems += _tilelang_entry_problems(kid, kernel)
            continue
        if kernel.kind == "tilelang":
            # Ours: built per variant by its module, whose fit_reports() compiles every
            # shipped variant with nvcc for sm_80/sm_86 (checked by its package's AOT test).
            if not ships_tilelang_fit(coverage.final.index, kernel.module):
                problems.append(
                    f"{kid} ({kernel.where}): our TileLang kernel is on the path, but its "
                    "module defines no fit_reports() to check it on sm_80/sm_86"
                )
            continue
        if kernel.kind != "triton":
            problems.append(
                f"{kid} ({kernel.where}): a {kernel.kind} kernel on the path; this test "
                "compiles Triton only: replace it or allowlist it with a reason"
            )
            continue
        if kernel.is_ours:
            mine = [
                s
                for s in shipped_specs(coverage.final.index, kernel.module)
                if _same_kernel(coverage.final, s.kernel, kid)
            ]
            if not mine:
                problems.append(
                    f"{kid} ({kernel.where}): ours, on the path, but no ampere_kernel_specs() "
                    "of its package ships a spec for it"
                )
            specs += mine
            continue
        if kid not in table.VLLM_LAUNCHES:
            problems.append(
                f"{kid} ({kernel.where}): newly on the path, with no launch configs in "
                "tools/sm80_launch_configs.py: read its call site and add "
                "them (or allowlist the kernel with a reason)"
            )
            continue
        table_issues = table.table_problems(kid, kernel_params(kernel))
        if table_issues:
            problems += table_issues
            continue
        specs += table.kernel_specs(kid, kernel_params(kernel))
    return specs, problems


def ships_tilelang_fit(index: SourceIndex, module: str) -> bool:
    """Whether ``module`` (where one of our TileLang kernels is defined) defines
    ``fit_reports()``: the nvcc/ptxas reports of its shipped variants on sm_80/sm_86,
    which its package's AOT test checks with ``ampere_fit.fit_violations``."""
    info = index.info(module)
    return info is not None and "fit_reports" in info.nodes


@functools.cache
def shipped_specs(index: SourceIndex, module: str) -> list[KernelSpec]:
    """Every spec the op package of ``module`` ships: the ``ampere_kernel_specs()`` of
    each of its modules that defines one (usually ``triton_kernel.py``)."""
    package = module.rpartition(".")[0]
    specs: list[KernelSpec] = []
    for name in index.all_modules("deepinfer_sm80"):
        if name == module or name.rpartition(".")[0] == package:
            info = index.info(name)
            if info is not None and "ampere_kernel_specs" in info.nodes:
                specs += importlib.import_module(name).ampere_kernel_specs()
    return specs


def _same_kernel(walk: Walk, spec_kernel: str, kernel_id: str) -> bool:
    """Whether a spec's ``module:attr`` names the kernel, directly or by a re-export."""
    module, _, attr = spec_kernel.partition(":")
    if "." in attr:
        return spec_kernel == kernel_id
    return ":".join(walk.follow_export(module, attr)) == kernel_id


def stale_table_entries(coverage: Coverage) -> list[str]:
    """Launch table entries for kernels that are no longer compiled here."""
    wanted = set(coverage.kernels_to_check) | set(known_gaps(coverage))
    return sorted((set(table.VLLM_LAUNCHES) | set(table.VLLM_TILELANG_LAUNCHES)) - wanted)


def _spec_key(spec: KernelSpec, index: SourceIndex) -> str:
    """Cache key: the spec, the kernel's module source (and, for ours, every op module:
    helpers live there), vLLM's and Triton's versions."""
    module = spec.kernel.partition(":")[0]
    info = index.info(module)
    parts = [
        json.dumps(asdict(spec), sort_keys=True, default=str),
        info.source_sha if info else module,
        version("triton"),
        version("vllm"),
    ]
    if module.startswith("deepinfer_sm80"):
        ops_root = index.roots["deepinfer_sm80"] / "ops"
        for path in sorted(ops_root.rglob("*.py")):
            parts.append(hashlib.sha256(path.read_bytes()).hexdigest())
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def compile_cached(
    specs: list[KernelSpec],
    cache_dir: Path | None,
    index: SourceIndex,
    jobs: int = 2,
) -> list[FitReport]:
    """``compile_for_ampere`` for every spec, reusing reports cached under ``cache_dir``
    (keyed by ``_spec_key``) and compiling the rest in ``jobs`` parallel subprocesses."""
    reports: dict[int, list[FitReport]] = {}
    todo: list[int] = []
    keys = [_spec_key(s, index) for s in specs]
    for i, key in enumerate(keys):
        cached = cache_dir / f"{key}.json" if cache_dir else None
        if cached is not None and cached.is_file():
            reports[i] = [FitReport(**r) for r in json.loads(cached.read_text())]
        else:
            todo.append(i)
    chunks = [todo[j::jobs] for j in range(jobs) if todo[j::jobs]]
    with ThreadPoolExecutor(max_workers=max(1, len(chunks))) as pool:
        results = pool.map(lambda chunk: compile_for_ampere([specs[i] for i in chunk]), chunks)
        for chunk, chunk_reports in zip(chunks, results, strict=True):
            per_spec = len(chunk_reports) // len(chunk)
            for n, i in enumerate(chunk):
                reports[i] = chunk_reports[n * per_spec : (n + 1) * per_spec]
                if cache_dir is not None:
                    cache_dir.mkdir(parents=True, exist_ok=True)
                    (cache_dir / f"{keys[i]}.json").write_text(
                        json.dumps([asdict(r) for r in reports[i]])
                    )
    return [r for i in range(len(specs)) for r in reports[i]]


def limit_problems(reports: list[FitReport], ours: set[str]) -> list[str]:
    """Ours: 48 KB static shared memory per CTA, no spills (``fit_violations``). vLLM's:
    the arch's opt-in shared memory per block (``arch.ArchLimits``); a failed compile is a
    problem for both; vLLM's spills are reported, not failed (not ours to tune)."""
    by_arch = {f"sm_{a.capability[0]}{a.capability[1]}": a for a in AMPERE_ARCHES}
    problems = fit_violations([r for r in reports if r.label in ours])
    for r in reports:
        if r.label in ours:
            continue
        if r.error is not None:
            problems.append(f"{r.label} on {r.arch}: compile failed: {r.error}")
            continue
        limit = by_arch[r.arch].optin_smem_per_block_bytes
        if r.shared_bytes is not None and r.shared_bytes > limit:
            problems.append(
                f"{r.label} on {r.arch}: {r.shared_bytes} B shared memory > {limit} B "
                f"({by_arch[r.arch].name} opt-in limit)"
            )
    return problems


# ---------------------------------------------------------------------------------------
# vLLM's TileLang kernels: specs, compilation (cached, in subprocesses), limits


@dataclass(frozen=True)
class TileLangSpec:
    """One specialization of a vLLM ``tilelang.jit`` kernel to compile for Ampere."""

    label: str
    kernel: str  # "module:attr" of the JIT kernel
    params: dict  # its keyword (compile-time) parameters
    tensors: tuple = ()  # (dtype, shape) stand-ins for its leading tensor arguments


def tilelang_params(kernel: KernelSite) -> list[tuple[str, str | None, str | None]]:
    return [(p.name, p.annotation, p.default) for p in kernel.params]


def _tilelang_entry_problems(kid: str, kernel: KernelSite) -> list[str]:
    if kid not in table.VLLM_TILELANG_LAUNCHES:
        return [
            f"{kid} ({kernel.where}): a TileLang kernel newly on the path, with no launches "
            "in VLLM_TILELANG_LAUNCHES (tools/sm80_launch_configs.py): "
            "read its call site and add them (or allowlist the kernel with a reason)"
        ]
    return table.tilelang_table_problems(kid, tilelang_params(kernel))


def tilelang_specs(coverage: Coverage) -> tuple[list[TileLangSpec], list[str]]:
    """TileLangSpecs for every vLLM TileLang kernel to check (and every TileLang known
    gap), and what keeps one from having specs."""
    specs: list[TileLangSpec] = []
    problems: list[str] = []
    wanted = {**coverage.kernels_to_check, **known_gaps(coverage)}
    for kid, kernel in sorted(wanted.items()):
        if kernel.kind != "tilelang" or kernel.is_ours:
            continue
        entry_problems = _tilelang_entry_problems(kid, kernel)
        if entry_problems:
            problems += entry_problems
            continue
        module, _, attr = kid.partition(":")
        for launch in table.VLLM_TILELANG_LAUNCHES[kid]:
            specs.append(
                TileLangSpec(
                    label=f"{module.rsplit('.', 1)[-1]}:{attr}[{launch.variant}]",
                    kernel=kid,
                    params=dict(launch.params),
                    tensors=tuple((d, tuple(shape)) for d, shape in launch.tensors),
                )
            )
    return specs, problems


def _tilelang_spec_key(spec: TileLangSpec, index: SourceIndex) -> str:
    """Cache key: the spec, the kernel's module source and vLLM's TileLang setup (pass
    configs), the vLLM, TileLang and nvcc in use."""
    module = spec.kernel.partition(":")[0]
    parts = [json.dumps(asdict(spec), sort_keys=True, default=str)]
    for name in (module, "vllm.tilelang_utils"):
        info = index.info(name)
        parts.append(info.source_sha if info else name)
    parts += [version("tilelang"), version("vllm"), _nvcc_version()]
    return "tl-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


@functools.cache
def _nvcc_version() -> str:
    from tilelang.contrib import nvcc

    compiler = nvcc.get_nvcc_compiler()
    try:
        run = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"{compiler}: {exc}"
    return f"{compiler}: {run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ''}"


def compile_tilelang_cached(
    specs: list[TileLangSpec],
    cache_dir: Path | None,
    index: SourceIndex,
    jobs: int = 2,
    timeout_s: float = 900,
) -> list[FitReport]:
    """Compile every spec for sm_80 and sm_86 (reports in that order, per spec), reusing
    reports cached under ``cache_dir`` and compiling the rest in ``jobs`` subprocesses."""
    ccs = list(AMPERE_CCS)
    keys = [_tilelang_spec_key(s, index) for s in specs]
    reports: dict[int, list[FitReport]] = {}
    for i, key in enumerate(keys):
        cached = cache_dir / f"{key}.json" if cache_dir else None
        if cached is not None and cached.is_file():
            reports[i] = [FitReport(**r) for r in json.loads(cached.read_text())]
    units = [(i, cc) for i in range(len(specs)) if i not in reports for cc in ccs]
    chunks = [units[j::jobs] for j in range(jobs) if units[j::jobs]]
    with ThreadPoolExecutor(max_workers=max(1, len(chunks))) as pool:
        results = pool.map(
            lambda chunk: _compile_tilelang_subprocess(
                [(specs[i], cc) for i, cc in chunk], timeout_s
            ),
            chunks,
        )
        fresh: dict[tuple[int, int], FitReport] = {}
        for chunk, chunk_reports in zip(chunks, results, strict=True):
            fresh.update(zip(chunk, chunk_reports, strict=True))
    for i in {i for i, _ in units}:
        reports[i] = [fresh[(i, cc)] for cc in ccs]
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)
            (cache_dir / f"{keys[i]}.json").write_text(json.dumps([asdict(r) for r in reports[i]]))
    return [r for i in range(len(specs)) for r in reports[i]]


def _compile_tilelang_subprocess(
    units: list[tuple[TileLangSpec, int]], timeout_s: float
) -> list[FitReport]:
    """``_compile_tilelang_here`` in a process of its own: it re-executes vLLM's TileLang
    modules on a stand-in CUDA platform, which must not leak into the caller. A private
    TileLang cache makes every compile fresh, so each kernel keeps its lowered module (the
    dynamic shared memory size is read there)."""
    payload = json.dumps([[asdict(spec), cc] for spec, cc in units])
    with tempfile.TemporaryDirectory(prefix="tilelang-aot-") as cache:
        return run_compile_subprocess(
            "tools.sm80_coverage_proof",
            payload,
            timeout_s,
            what="TileLang AOT compile",
            extra_env={"TILELANG_CACHE_DIR": cache},
        )


_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)")


class _Lowered:
    """What ``tilelang_build.dynamic_smem_bytes`` asks of a kernel variant when the
    kernel has no lowered module of its own (loaded from TileLang's disk cache)."""

    def __init__(self, func, pass_configs: dict) -> None:
        self._func = func
        self._pass_configs = pass_configs

    def build(self):
        return self._func

    def pass_configs(self) -> dict:
        return self._pass_configs


def _tilelang_nvcc_flags(pass_configs: dict) -> list[str]:
    """The device flags TileLang's CUDA compile derives from the pass configs
    (``tilelang.engine.lower.tilelang_callback_cuda_compile``), so that ptxas -v measures
    the kernel TileLang builds."""
    import shlex

    from tilelang import PassConfigKey

    flags: list[str] = []
    extra = pass_configs.get(PassConfigKey.TL_DEVICE_COMPILE_FLAGS)
    if extra:
        flags += shlex.split(extra) if isinstance(extra, str) else [str(f) for f in extra]
    if pass_configs.get(PassConfigKey.TL_ENABLE_FAST_MATH):
        flags.append("--use_fast_math")
    level = pass_configs.get(PassConfigKey.TL_PTXAS_REGISTER_USAGE_LEVEL)
    if level is not None:
        flags.append(f"--ptxas-options=--register-usage-level={int(level)}")
    return flags


def _compile_tilelang_here(units: list[tuple[TileLangSpec, int]]) -> list[FitReport]:
    """Compile each spec for ``sm_{cc}`` with vLLM's own JIT kernel, as a CUDA sm_80
    process builds it (``vllm_on_sm80``: CUDA pass configs, no PDL), and measure it the
    way our mHC package measures its TileLang kernels."""
    import tilelang
    import torch
    from vllm.model_executor.warmup.jit_warmup_tilelang_helper import (
        make_tilelang_warmup_tensor,
    )

    # vLLM's TileLang kernels and ours are measured by one piece of code.
    from deepinfer_sm80.ampere_fit import PTXAS_REGS, PTXAS_SMEM, PTXAS_SPILL
    from deepinfer_sm80.tilelang_build import cuda_target, dynamic_smem_bytes, ptxas_verbose
    from tools.vllm_on_sm80 import reimport_on_cuda

    # tilelang_utils first: the kernel modules take T, tilelang and the pass configs
    # from it when they are re-executed
    reimport_on_cuda("vllm.tilelang_utils")
    modules: dict = {}
    reports = []
    for spec, cc in units:
        arch = f"sm_{cc}"
        try:
            module_name, _, attr = spec.kernel.partition(":")
            if module_name not in modules:
                modules[module_name] = reimport_on_cuda(module_name)
            module = modules[module_name]
            if getattr(module, "ENABLE_PDL", False):
                raise RuntimeError("the stand-in sm_80 platform enabled PDL (sm_90+ only)")
            jit = getattr(module, attr)
            tensors = [
                make_tilelang_warmup_tensor(getattr(torch, dtype), *shape)
                for dtype, shape in spec.tensors
            ]
            func = jit.get_tir(*tensors, **spec.params)
            target = cuda_target(cc)
            pass_configs = dict(jit.pass_configs or {})
            kernel = tilelang.compile(
                func,
                target=target,
                execution_backend=jit.execution_backend,
                pass_configs=pass_configs,
                compile_flags=jit.compile_flags,
            )
            source = kernel.get_kernel_source()
            text = ptxas_verbose(source, cc, _tilelang_nvcc_flags(pass_configs))
            regs = PTXAS_REGS.search(text)
            spill = PTXAS_SPILL.search(text)
            static = PTXAS_SMEM.search(text)
            if regs is None or spill is None:
                raise RuntimeError(f"could not parse ptxas -v output: {text.strip()[-1000:]}")
            smem = dynamic_smem_bytes(kernel, _Lowered(func, pass_configs), target)
            threads = _LAUNCH_BOUNDS.search(source)
            reports.append(
                FitReport(
                    spec.label,
                    arch,
                    smem + (int(static.group(1)) if static else 0),
                    int(regs.group(1)),
                    int(spill.group(1)),
                    int(spill.group(2)),
                    threads=int(threads.group(1)) if threads else 0,
                )
            )
        except Exception as exc:  # noqa: BLE001 -- every failure becomes a report line
            msg = f"{type(exc).__name__}: {exc}"
            reports.append(FitReport(spec.label, arch, None, None, None, None, error=msg[:2000]))
    return reports


def tilelang_limit_problems(reports: list[FitReport]) -> list[str]:
    """vLLM's TileLang kernels: a failed compile, shared memory over the arch's opt-in
    limit per block (``arch.ArchLimits``), any spill, or a CTA whose registers do not fit
    the register file (the launch would fail)."""
    by_arch = {f"sm_{a.capability[0]}{a.capability[1]}": a for a in AMPERE_ARCHES}

    def over_limits(r: FitReport) -> list[str]:
        found = []
        limit = by_arch[r.arch].optin_smem_per_block_bytes
        if r.shared_bytes > limit:
            found.append(
                f"{r.shared_bytes} B shared memory > {limit} B "
                f"({by_arch[r.arch].name} opt-in limit)"
            )
        if not r.threads:
            found.append("no __launch_bounds__ in the generated source")
        elif r.registers * r.threads > REGISTERS_PER_SM:
            found.append(
                f"{r.registers} registers x {r.threads} threads > "
                f"{REGISTERS_PER_SM} registers per SM: the launch fails"
            )
        return found

    return report_problems(reports, over_limits)


# ---------------------------------------------------------------------------------------
# Custom ops: device code for sm_80 and sm_86 in the defining library


@dataclass(frozen=True)
class OpCode:
    """Where a library op lives and what device code serves it on Ampere."""

    op: str  # "namespace::name"
    library: str | None  # file name, None when no library defines it
    library_archs: dict[str, list[str]]  # "sm_80"/"sm_86" -> runnable cubin/PTX archs
    kernels: dict[str, int]  # arch -> kernels whose name matches the op (0 if unmatched)

    def problems(self) -> list[str]:
        if self.library is None:
            return [f"{self.op}: no shared library under vllm defines it"]
        out = []
        for arch, runnable in self.library_archs.items():
            if not runnable:
                out.append(f"{self.op}: {self.library} has no device code for {arch}")
        if any(self.kernels.values()):
            for arch, number in {"sm_80": 80, "sm_86": 86}.items():
                if not any(
                    n for a, n in self.kernels.items() if inventory.cubin_runs_on(a, number)
                ):
                    out.append(
                        f"{self.op}: {self.library} has kernels named like the op for "
                        f"{sorted(a for a, n in self.kernels.items() if n)} but none for {arch}"
                    )
        return out


def check_ops(coverage: Coverage, cache_dir: Path | None = None) -> list[OpCode]:
    """Find each library op's shared library and read its device code (cached)."""
    ops = sorted(coverage.library_ops_to_check)
    libraries = inventory.candidate_libraries([coverage.final.index.roots["vllm"]])
    where = inventory.find_op_libraries([tuple(op.split("::")) for op in ops], libraries)
    out = []
    for op in ops:
        libs = where[tuple(op.split("::"))]  # type: ignore[index]
        if not libs:
            out.append(OpCode(op, None, {}, {}))
            continue
        code = inventory.library_code(libs[0], cache_dir)
        matched = code.kernels_for(op.split("::")[1])
        out.append(
            OpCode(
                op,
                libs[0].name,
                {"sm_80": code.runnable_archs(80), "sm_86": code.runnable_archs(86)},
                {arch: len(names) for arch, names in matched.items()},
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# The report: the coverage list, as JSON and as a table


def coverage_report(
    coverage: Coverage,
    fit_reports: list[FitReport] | None = None,
    specs: list[KernelSpec] | None = None,
    op_codes: list[OpCode] | None = None,
) -> dict:
    """Every kernel and op found, with what became of it, as JSON-ready data."""
    by_kernel: dict[str, list[dict]] = defaultdict(list)
    for spec in specs or []:
        for r in fit_reports or []:
            if r.label == spec.label:
                by_kernel[spec.kernel].append(asdict(r))
    listed_kernels = coverage.allowlist.kernels
    kernels = []
    for kid, k in sorted(coverage.found_kernels.items()):
        if kid in coverage.kernels_to_check:
            status = "compiled for sm_80/sm_86"
        elif kid in listed_kernels:
            status = f"allowlisted: {listed_kernels[kid].category}"
        elif kid in coverage.kernels_on_path:
            status = "device helper (compiled inside its callers)"
        elif kid in coverage.replaced_kernels:
            status = "replaced by the plugin"
        elif kid in coverage.before_ledger.live_kernels:
            status = "off the path after the plugin"
        elif kid in coverage.unpatched.live_kernels:
            status = "cut by the allowlist"
        else:
            status = "not reached"
        kernels.append(
            {
                "id": kid,
                "kind": k.kind,
                "where": k.where,
                "status": status,
                "fit": [r for key, rs in by_kernel.items() if _spec_matches(key, kid) for r in rs],
            }
        )
    for kid, k in sorted(coverage.kernels_on_path.items()):
        if kid not in coverage.found_kernels:  # ours, reached through the ledger
            status = (
                "compiled for sm_80/sm_86"
                if kid in coverage.kernels_to_check
                else "device helper (compiled inside its callers)"
            )
            kernels.append(
                {
                    "id": kid,
                    "kind": k.kind,
                    "where": k.where,
                    "status": status,
                    "fit": [
                        r for key, rs in by_kernel.items() if _spec_matches(key, kid) for r in rs
                    ],
                }
            )
    codes = {c.op: c for c in op_codes or []}
    listed_ops = coverage.allowlist.ops
    ops = []
    for op in sorted(set(coverage.found_ops) | set(coverage.ops_on_path)):
        if op.split("::")[0] in PYTHON_OP_NAMESPACES:
            status = "python op (its code is walked)"
        elif op in codes:
            status = "device code checked"
        elif op in listed_ops:
            status = f"allowlisted: {listed_ops[op].category}"
        elif op in coverage.replaced_ops:
            status = "replaced by the plugin"
        elif op in coverage.ops_on_path:
            status = "on the path, not checked"
        else:
            status = "cut by the allowlist"
        entry = {"op": op, "status": status, "on_path": op in coverage.ops_on_path}
        if op in codes:
            entry |= asdict(codes[op])
        ops.append(entry)
    on_path = coverage.kernels_on_path
    return {
        "vllm": version("vllm"),
        "triton": version("triton"),
        "ledger_targets": sorted(coverage.redirects),
        "counts": {
            "kernels_found": len(coverage.found_kernels),
            "kernels_reached_without_plugin_or_allowlist": len(coverage.unpatched.live_kernels),
            "kernels_on_path": len(on_path),
            "kernels_on_path_ours": sum(1 for k in on_path.values() if k.is_ours),
            "kernels_replaced_by_plugin": len(coverage.replaced_kernels),
            "kernels_allowlisted_on_path": len(coverage.allowlisted_kernels),
            "kernels_compiled": len(coverage.kernels_to_check),
            "ops_found": len(coverage.found_ops),
            "ops_on_path": len(coverage.ops_on_path),
            "library_ops_checked": len(coverage.library_ops_to_check),
            "ops_replaced_by_plugin": len(coverage.replaced_ops),
            "allowlist_entries": len(coverage.allowlist.entries),
        },
        "kernels": kernels,
        "ops": ops,
    }


def _spec_matches(spec_kernel: str, kernel_id: str) -> bool:
    """A spec names the kernel directly or through ``vllm_on_sm80``."""
    if spec_kernel == kernel_id:
        return True
    module, _, qualname = kernel_id.partition(":")
    return spec_kernel.endswith(f":{module.replace('.', '__')}.{qualname}")


def format_coverage(report: dict) -> str:
    """The coverage list as a table: kernels and ops on the path, then the counts."""
    lines = ["kernels on DeepSeek-V4.1's SM80 path (after the plugin):"]
    for k in report["kernels"]:
        if k["status"] in (
            "not reached",
            "cut by the allowlist",
            "off the path after the plugin",
            "replaced by the plugin",
        ):
            continue
        worst = ""
        for arch in ("sm_80", "sm_86"):
            fits = [r for r in k["fit"] if r["arch"] == arch]
            if fits:
                if any(r["error"] for r in fits):
                    worst += f" {arch}:FAIL"
                else:
                    smem = max(r["shared_bytes"] for r in fits)
                    regs = max(r["registers"] for r in fits)
                    worst += f" {arch}:{smem}B/{regs}r"
        lines.append(f"  {k['status'][:34]:34} {k['id']}{worst}")
    lines.append("replaced by the plugin:")
    lines += [f"  {k['id']}" for k in report["kernels"] if k["status"] == "replaced by the plugin"]
    lines.append("custom ops on the path:")
    for o in report["ops"]:
        if not o["on_path"]:
            continue
        where = f" [{o.get('library')}]" if o.get("library") else ""
        lines.append(f"  {o['status'][:34]:34} {o['op']}{where}")
    lines.append("counts: " + ", ".join(f"{k}={v}" for k, v in report["counts"].items()))
    return "\n".join(lines)


def _main() -> None:
    """Subprocess entry of ``compile_tilelang_cached``: JSON [[spec, cc], ...] on stdin,
    the reports as one JSON line on stdout."""
    units = [
        (TileLangSpec(**{**spec, "tensors": tuple(tuple(t) for t in spec["tensors"])}), cc)
        for spec, cc in json.loads(sys.stdin.read())
    ]
    reports = _compile_tilelang_here(units)
    print(json.dumps([asdict(r) for r in reports]))


if __name__ == "__main__":
    _main()
