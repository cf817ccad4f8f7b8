"""The one home of our TileLang builds: compile, cache, ahead-of-time, and the Ampere fit.

Every TileLang kernel of ours (mHC, sparse MLA) is a *variant*: an object with
``build()`` (the PrimFunc), ``pass_configs()``, ``label`` and ``threads()``.
``get_kernel`` compiles it through TileLang's own cache (memory, then disk under
``TILELANG_CACHE_DIR``, then nvcc), so a kernel compiled ahead of time for
``sm_80``/``sm_86`` is found on disk by a server on that architecture: the disk key is a
hash of the kernel's TIR, the target, the execution backend and the pass configs, and all
four are pinned here so the AOT build and the server agree.

``aot_build`` is the AOT step of one op (no GPU: nvcc from the ``nvidia-cuda-nvcc``
wheel): its variants compiled for each ``sm_{cc}`` into ``DEST/tilelang`` (a TileLang
cache folder), ``DEST/manifest.json`` listing what was built, how long it took and its
resources, and an error naming every build that does not fit Ampere. ``python -m
deepinfer_sm80.aot build`` runs it for every TileLang op (``deepinfer_sm80.aot`` says
where each op's folder lies). At startup ``warm`` copies an op's AOT folder into the live
cache (``seed_tilelang_cache``, never overwriting) and compiles or loads every variant
the server launches. ``fit_report`` measures a build the way ``ampere_fit`` measures
Triton kernels: registers and spills from ``ptxas -v``, shared memory from TileLang's
dynamic allocation plus ptxas' static figure; ``fit_reports`` does so for a list of
variants and architectures.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from deepinfer_sm80.ampere_fit import PTXAS_REGS, PTXAS_SMEM, PTXAS_SPILL, fit_violations
from deepinfer_sm80.arch import ptxas_arch
from deepinfer_sm80.kernel_spec import FitReport

TILELANG_SUBDIR = "tilelang"  # the TileLang cache folder inside an AOT folder
MANIFEST = "manifest.json"


class TileLangVariant(Protocol):
    """One compiled TileLang kernel: hashable, so compiled kernels can be cached by it."""

    @property
    def label(self) -> str: ...

    def build(self) -> Any: ...

    def pass_configs(self) -> dict: ...

    def threads(self) -> int: ...

    # Optional: ``builds_for(cc) -> bool``, False for an architecture whose servers never
    # look the variant up (``compile_into_cache`` skips it there).


# Pinned so that a kernel compiled ahead of time and the one the server asks for share a
# cache key: TileLang's "auto" backend could resolve differently on the two machines.
EXECUTION_BACKEND = "tvm_ffi"


def ampere_pass_configs() -> dict:
    """The TileLang pass configs every kernel of ours compiles with, as a fresh dict (a
    variant may add its own, such as device compile flags).

    Warp specialization and TMA lowering are Hopper (sm_90) lowerings: on sm_80/sm_86 they
    are inert. They stay off so that a Hopper GPU (an H100 or H200, where the kernels are
    measured) runs the same kind of code as Ampere. The configs are part of TileLang's
    cache key, so the AOT build and the server take them from here alike."""
    import tilelang

    key = tilelang.PassConfigKey
    return {key.TL_DISABLE_WARP_SPECIALIZED: True, key.TL_DISABLE_TMA_LOWER: True}


def cuda_target(cc: int) -> dict:
    """TileLang target for compute capability ``cc`` as its detector builds it on a GPU of
    that capability (80 -> sm_80, 86 -> sm_86; 90 -> sm_90a: TileLang names Hopper's
    arch-specific target), so that a build made here is the cache entry a server there
    looks up."""
    from tilelang.contrib import nvcc

    return {"kind": "cuda", "arch": f"sm_{nvcc.get_target_arch((cc // 10, cc % 10))}"}


_lock = threading.Lock()
_compiled: dict[tuple[TileLangVariant, str], Any] = {}


def get_kernel(variant: TileLangVariant, target: dict | str = "auto"):
    """The compiled JITKernel for ``variant`` (compiled once per process and target)."""
    key = (variant, repr(target))
    kernel = _compiled.get(key)
    if kernel is not None:
        return kernel
    import tilelang

    with _lock:
        kernel = _compiled.get(key)
        if kernel is None:
            kernel = tilelang.compile(
                variant.build(),
                target=target,
                execution_backend=EXECUTION_BACKEND,
                pass_configs=variant.pass_configs(),
            )
            _compiled[key] = kernel
    return kernel


def forget_compiled() -> None:
    """Drop this module's compiled kernels (tests use it to force a cache lookup)."""
    with _lock:
        _compiled.clear()


def tilelang_cache_dir(env) -> Path:
    """TileLang's disk cache as TileLang resolves it (``TILELANG_CACHE_DIR``, else
    ``~/.tilelang/cache``), without importing TileLang (the plugin seeds it in every
    vLLM process, the API server's included)."""
    return Path(env.get("TILELANG_CACHE_DIR") or Path.home() / ".tilelang" / "cache")


def seed_tilelang_cache(aot_dir: Path | str, cache_dir: Path | str | None = None) -> int:
    """Copy AOT cache entries missing from the live TileLang cache; returns how many.

    Never overwrites: an entry already there was compiled by this TileLang on this host.
    """
    src = Path(aot_dir) / TILELANG_SUBDIR
    if not src.is_dir():
        return 0
    dst_root = Path(cache_dir) if cache_dir is not None else tilelang_cache_dir(os.environ)
    copied = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_dir() or any(part in ("tmp", ".staging") for part in rel.parts):
            continue
        target = dst_root / rel
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        # One temporary name per process: the workers of a server seed at once.
        tmp = target.with_name(f".{target.name}.seeding-{os.getpid()}")
        shutil.copy2(path, tmp)
        os.replace(tmp, target)  # atomic: concurrent workers never see half a file
        copied += 1
    return copied


def dynamic_smem_bytes(kernel, variant: TileLangVariant, target: dict) -> int:
    """TileLang's dynamic shared-memory size (the ``dyn_shared_memory_buf`` attribute)."""
    import tilelang
    import tvm
    from tvm.target import Target

    artifact = getattr(kernel, "artifact", None)
    if artifact is None:  # loaded from the disk cache: lower again to read the attribute
        tgt = Target(target)
        with tvm.transform.PassContext(config=variant.pass_configs()), tgt:
            artifact = tilelang.lower(variant.build(), target=tgt)
    total = 0
    for _, func in artifact.device_mod.functions.items():
        if func.attrs is not None and "dyn_shared_memory_buf" in func.attrs:
            total = max(total, int(func.attrs["dyn_shared_memory_buf"]))
    return total


def ptxas_verbose(
    source: str, cc: int, extra_flags: list[str], cubin_out: str | os.PathLike | None = None
) -> str:
    """nvcc -cubin -Xptxas -v on TileLang's generated CUDA source, with its include paths;
    the cubin is kept at ``cubin_out`` when given (to read its SASS)."""
    from tilelang import env
    from tilelang.contrib import nvcc

    with tempfile.TemporaryDirectory() as tmp:
        cu = os.path.join(tmp, "k.cu")
        with open(cu, "w") as f:
            f.write(source)
        cmd = [
            nvcc.get_nvcc_compiler(),
            "-cubin",
            "-O3",
            f"-arch={ptxas_arch(cc)}",
            "-std=c++20",
            "-I" + env.TILELANG_TEMPLATE_PATH,
            "-I" + env.CUTLASS_INCLUDE_DIR,
            "-Xptxas",
            "-v",
            "-w",
            *extra_flags,
            "-o",
            os.path.join(tmp, "k.cubin"),
            cu,
        ]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if run.returncode == 0 and cubin_out is not None:
            shutil.copyfile(os.path.join(tmp, "k.cubin"), cubin_out)
    if run.returncode != 0:
        raise RuntimeError(f"nvcc failed for sm_{cc}: {run.stderr.strip()[-2000:]}")
    return run.stdout + run.stderr


def fit_report(variant: TileLangVariant, cc: int):
    """Compile ``variant`` for ``sm_{cc}`` (through the TileLang cache) and measure it."""
    arch = f"sm_{cc}"
    target = cuda_target(cc)
    try:
        t0 = time.perf_counter()
        kernel = get_kernel(variant, target)
        compile_s = time.perf_counter() - t0
        flags = list(variant.pass_configs().get(device_flags_key(), []))
        text = ptxas_verbose(kernel.get_kernel_source(), cc, flags)
        regs = PTXAS_REGS.search(text)
        spill = PTXAS_SPILL.search(text)
        static = PTXAS_SMEM.search(text)
        if regs is None or spill is None:
            raise RuntimeError(f"could not parse ptxas -v output: {text.strip()[-1000:]}")
        smem = dynamic_smem_bytes(kernel, variant, target) + (int(static.group(1)) if static else 0)
        report = FitReport(
            variant.label,
            arch,
            smem,
            int(regs.group(1)),
            int(spill.group(1)),
            int(spill.group(2)),
            threads=variant.threads(),
            # Variants that cap registers for several CTAs per SM say how many.
            min_ctas_per_sm=getattr(variant, "min_ctas_per_sm", 1),
            smem_optin=getattr(variant, "smem_optin", False),
        )
        return report, compile_s
    except Exception as exc:  # noqa: BLE001 -- every failure becomes a report line
        msg = f"{type(exc).__name__}: {exc}"
        return FitReport(variant.label, arch, None, None, None, None, error=msg[:2000]), 0.0


def fit_reports(variants, ccs) -> list[FitReport]:
    """``fit_report`` of every variant on every ``sm_{cc}`` (architecture-major)."""
    return [fit_report(v, cc)[0] for cc in ccs for v in variants]


def device_flags_key():
    import tilelang

    return tilelang.PassConfigKey.TL_DEVICE_COMPILE_FLAGS


def compile_into_cache(dest: Path, variants, ccs, log, what: str) -> tuple[list, list[dict]]:
    """Compile ``variants`` (anything with ``build()``, ``pass_configs()``, ``label``,
    ``threads()``) for each ``sm_{cc}`` the variant ``builds_for`` into ``dest/tilelang``, a
    TileLang cache folder, measuring each build. Returns the fit reports and one manifest
    row per build."""
    cache = Path(dest) / TILELANG_SUBDIR
    cache.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TILELANG_CACHE_DIR")
    os.environ["TILELANG_CACHE_DIR"] = str(cache)  # TileLang reads it on every lookup
    reports, rows = [], []
    try:
        for cc in ccs:
            for variant in variants:
                if not getattr(variant, "builds_for", lambda cc: True)(cc):
                    continue
                report, seconds = fit_report(variant, cc)
                reports.append(report)
                rows.append({**asdict(report), "compile_seconds": round(seconds, 2)})
                log(
                    f"{what} AOT {variant.label} sm_{cc}: {seconds:.1f} s, "
                    f"{report.registers} regs, {report.shared_bytes} B smem, "
                    f"spills {report.spill_store_bytes}/{report.spill_load_bytes}"
                    + (f", ERROR {report.error}" if report.error else "")
                )
    finally:
        if previous is None:
            os.environ.pop("TILELANG_CACHE_DIR", None)
        else:
            os.environ["TILELANG_CACHE_DIR"] = previous
    return reports, rows


def aot_build(dest: Path | str, variants, ccs, what: str, log=print, **manifest_fields) -> dict:
    """One op's AOT folder: ``variants`` compiled for each ``sm_{cc}`` into
    ``dest/tilelang`` and ``dest/manifest.json`` (``arches``, then ``manifest_fields``,
    then one ``kernels`` row per build); raise ``RuntimeError`` naming every build that
    does not fit Ampere (the manifest is written first, so it shows them too)."""
    dest = Path(dest)
    # Kernels already compiled in this process would be served from memory and never
    # reach the new cache folder.
    forget_compiled()
    reports, rows = compile_into_cache(dest, variants, ccs, log, what)
    manifest = {"arches": [f"sm_{cc}" for cc in ccs], **manifest_fields, "kernels": rows}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    problems = fit_violations(reports)
    if problems:
        raise RuntimeError(f"{what} AOT kernels do not fit Ampere:\n" + "\n".join(problems))
    return manifest


def warm(variants, what: str, aot_dir: Path | str | None = None, target="auto", log=print):
    """Compile (or load from TileLang's cache) every variant, one log line each and a
    total; first, when ``aot_dir`` (an op's AOT folder, see ``aot_build``) exists, copy its
    builds into the live cache. Returns one record per variant."""
    if aot_dir is not None and Path(aot_dir).is_dir():
        n = seed_tilelang_cache(aot_dir)
        log(f"{what}: seeded {n} TileLang cache files from {aot_dir}")
    records = []
    t_all = time.perf_counter()
    for variant in variants:
        t0 = time.perf_counter()
        get_kernel(variant, target)
        dt = time.perf_counter() - t0
        records.append({"variant": variant.label, "target": str(target), "seconds": dt})
        log(f"{what} kernel {variant.label} for {target}: ready in {dt:.2f} s")
    log(f"{what}: {len(records)} kernel variants ready in {time.perf_counter() - t_all:.1f} s")
    return records
