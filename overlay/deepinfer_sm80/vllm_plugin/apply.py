"""Gates, resolution and application of the ledger (the part that imports vLLM)."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from deepinfer_sm80 import envs
from deepinfer_sm80.vllm_plugin.ledger import LEDGER, VERIFIED_VLLM, LedgerEntry, format_ledger

logger = logging.getLogger("deepinfer_sm80")


class PluginError(RuntimeError):
    """Activation refused; nothing was patched."""


def nvml_capabilities() -> list[tuple[int, int]]:
    """Compute capability of every visible GPU via NVML (no CUDA context); [] if none."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 -- no driver / no GPU: NVML raises its own types
        return []
    try:
        return [
            pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def _resolve(path: str):
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 -- any import failure means "not resolvable"
        raise PluginError(f"cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    if not hasattr(module, attr):
        raise PluginError(f"{module_name} has no attribute {attr!r}")
    return module, attr, getattr(module, attr)


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def _kernel_override_of(original, replacement) -> bool:
    """True when ``original`` is vLLM's KernelOverride already routing to ``replacement``
    (a second activation in the same process)."""
    return getattr(original, "_impl", None) is replacement


def _check_kernel_params(e: LedgerEntry, target: str, original, replacement) -> None:
    """A kernel-level replacement receives the Triton kernel's launch arguments by name:
    its parameters must be the kernel's, in order."""
    kernel_args = tuple(getattr(original, "arg_names", ()))
    ours = tuple(name for name, _ in _params(replacement))
    if not kernel_args:
        raise PluginError(f"ledger entry {e.name!r}: {target} is not a Triton kernel")
    if ours != kernel_args:
        raise PluginError(
            f"ledger entry {e.name!r}: kernel {target} takes {kernel_args}, ours takes {ours}; "
            f"verified on vLLM {e.verified}"
        )


def plan_patches(entries: list[LedgerEntry]) -> list[tuple[LedgerEntry, list, object]]:
    """Resolve every target and replacement and check signatures -- before patching
    anything, so a mismatch leaves vLLM untouched."""
    planned = []
    for e in entries:
        _, _, replacement = _resolve(e.replacement)
        sites = []
        for target in e.targets:
            try:
                module, attr, original = _resolve(target)
            except PluginError as exc:
                raise PluginError(
                    f"ledger entry {e.name!r}: {exc}; the entry was verified on vLLM {e.verified}"
                ) from None
            if e.level == "kernel":
                if not _kernel_override_of(original, replacement):
                    _check_kernel_params(e, target, original, replacement)
            elif original is not replacement and _params(original) != _params(replacement):
                raise PluginError(
                    f"ledger entry {e.name!r}: {target} has signature "
                    f"{inspect.signature(original)}, ours is "
                    f"{inspect.signature(replacement)}; verified on vLLM {e.verified}"
                )
            sites.append((module, attr))
        planned.append((e, sites, replacement))
    return planned


def _override_kernel(module, attr: str, replacement) -> None:
    """vLLM's own extension point for Triton kernels: it swaps the kernel object for a
    KernelOverride wherever it is bound and forwards launch arguments to ``replacement``."""
    if _kernel_override_of(getattr(module, attr), replacement):
        return
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({f"{module.__name__}.{attr}": replacement})


def selected_entries(env: Mapping[str, str]) -> tuple[list[LedgerEntry], dict[str, str]]:
    wanted = envs.get("DEEPINFER_PATCHES", env).strip()
    if not wanted:
        return list(LEDGER), {}
    names = {n.strip() for n in wanted.split(",") if n.strip()}
    unknown = names - {e.name for e in LEDGER}
    if unknown:
        raise PluginError(
            f"DEEPINFER_PATCHES names unknown patches {sorted(unknown)}; known: "
            f"{[e.name for e in LEDGER]}"
        )
    skipped = {e.name: "skipped: not in DEEPINFER_PATCHES" for e in LEDGER if e.name not in names}
    return [e for e in LEDGER if e.name in names], skipped


def activate(env: Mapping[str, str], capabilities: list[tuple[int, int]] | None = None) -> dict:
    """Decide, patch, log one table and write the status file. Returns the status."""
    statuses: dict[str, str] = {}
    if envs.flag("DEEPINFER_DISABLE", env):
        return _finish(
            env, False, "DEEPINFER_DISABLE=1", {e.name: "skipped: disabled" for e in LEDGER}
        )
    forced = envs.flag("DEEPINFER_FORCE", env)
    caps = nvml_capabilities() if capabilities is None else capabilities
    ampere = bool(caps) and all(major == 8 for major, _ in caps)
    if not (ampere or forced):
        why = f"GPUs {caps or 'none'} are not SM8x (set DEEPINFER_FORCE=1 to force)"
        return _finish(env, False, why, {e.name: "skipped: inactive" for e in LEDGER})
    import vllm

    version = vllm.__version__
    if not version.startswith(VERIFIED_VLLM) and not envs.flag("DEEPINFER_ALLOW_VLLM_VERSION", env):
        raise PluginError(
            f"vLLM {version} is installed; the patch ledger was verified on vLLM {VERIFIED_VLLM}. "
            f"Install vllm=={VERIFIED_VLLM}, or set DEEPINFER_ALLOW_VLLM_VERSION=1 to try anyway"
        )
    dequant = env.get("VLLM_MXFP8_EMULATION_DEQUANT_AT_LOAD", "true").strip().lower()
    if dequant not in ("true", "1"):  # vLLM's own parsing: anything else means off
        raise PluginError(
            "VLLM_MXFP8_EMULATION_DEQUANT_AT_LOAD is off: wo_a would stay fp8 and o_proj would "
            "call DeepGEMM's fp8_einsum, which needs sm90+. Unset it on Ampere (the default "
            "dequantizes wo_a to bf16 at load)"
        )
    entries, statuses = selected_entries(env)
    for e, sites, replacement in plan_patches(entries):
        for module, attr in sites:
            if e.level == "kernel":
                _override_kernel(module, attr, replacement)
            else:
                setattr(module, attr, replacement)
        statuses[e.name] = f"applied: {len(sites)} sites"
    reason = "forced (DEEPINFER_FORCE=1)" if forced and not ampere else f"SM8x GPUs {caps}"
    seeded = seed_aot_kernels(env)
    return _finish(env, True, reason, statuses, aot_seeded=seeded)


def seed_aot_kernels(env: Mapping[str, str]) -> dict[str, int]:
    """Copy the image's ahead-of-time kernels (see aot.py) into the writable caches:
    Triton's, and TileLang's for the mHC and sparse-MLA kernels and vLLM's mHC pre-norm
    kernel (which vLLM's JIT warmup compiles before the server is ready). Returns the files or
    entries copied per part (``{}`` without an AOT folder).

    This runs at activation, before vLLM's profiling run and its first CUDA-graph capture
    launch our kernels: TileLang's cache seeded only by the kernel warmup, which vLLM
    calls after both, left those launches to compile (38 TileLang compiles of ours in a
    cold start of the smoke server on an H100, with the AOT folder present). A missing or
    unreadable AOT folder costs nothing but JIT compiles; it never stops the server, so
    problems are logged, not raised.
    """
    src = envs.get("DEEPINFER_AOT_DIR", env)
    if not src:
        return {}
    from deepinfer_sm80 import aot, tilelang_build

    caches = {
        aot.TRITON_SUBDIR: Path(env.get("TRITON_CACHE_DIR") or aot.default_triton_cache()),
        aot.MHC_SUBDIR: tilelang_build.tilelang_cache_dir(env),
        aot.SPARSE_MLA_SUBDIR: tilelang_build.tilelang_cache_dir(env),
        aot.VLLM_MHC_SUBDIR: tilelang_build.tilelang_cache_dir(env),
    }
    counts = {}
    for part, cache in caches.items():
        try:
            if part == aot.TRITON_SUBDIR:
                counts[part] = aot.seed(Path(src), cache)
            else:
                counts[part] = tilelang_build.seed_tilelang_cache(Path(src) / part, cache)
        except (OSError, aot.ForeignTritonBuildError) as exc:
            logger.warning(
                "deepinfer-sm80: AOT %s kernels in %s not seeded into %s: %s", part, src, cache, exc
            )
            counts[part] = 0
    logger.info("deepinfer-sm80: seeded AOT kernels from %s: %s", src, counts)
    return counts


def _finish(
    env: Mapping[str, str], active: bool, reason: str, statuses: dict[str, str], **extra
) -> dict:
    status = {
        "active": active,
        "reason": reason,
        "verified_vllm": VERIFIED_VLLM,
        "pid": os.getpid(),
        "time": time.time(),
        "patches": statuses,
        **extra,
    }
    logger.info(
        "deepinfer-sm80 plugin %s (%s)\n%s",
        "active" if active else "inactive",
        reason,
        format_ledger(statuses),
    )
    run_dir = Path(envs.get("DEEPINFER_RUNTIME_DIR", env))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "plugin-status.json").write_text(json.dumps(status, indent=1) + "\n")
    except OSError as exc:
        logger.warning("deepinfer-sm80: cannot write the status file in %s: %s", run_dir, exc)
    return status
