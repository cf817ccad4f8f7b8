"""Compile every mHC kernel a server will launch: at startup, or ahead of time without a GPU.

Startup (the plugin calls this once per worker, before the first forward)::

    from deepinfer_sm80.ops.mhc.warmup import prepare_mhc_kernels
    prepare_mhc_kernels(max_num_batched_tokens, aot_dir="/opt/deepinfer/kernels/mhc")

It copies AOT-built entries into the live TileLang cache (never overwriting), then asks
for every variant the token-count buckets up to ``max_num_batched_tokens`` need; each
one is either loaded from the cache or compiled, and one log line says which and how long.

Ahead of time (image build, no GPU; nvcc from the ``nvidia-cuda-nvcc`` wheel)::

    python -m deepinfer_sm80.ops.mhc.warmup aot /opt/deepinfer/kernels/mhc --arches "8.0 8.6"

compiles each variant for each architecture with an explicit TileLang target
``{"kind": "cuda", "arch": "sm_80"}`` (what TileLang's own detector builds on an A100,
``sm_86`` on an A10/3090) into ``DEST/tilelang`` (a TileLang cache folder), checks each
against the Ampere budget (``ptxas -v``: registers, spills; TileLang's dynamic shared
memory attribute plus ptxas' static figure: <= 48 KB per CTA) and writes
``DEST/manifest.json`` listing what was built, how long it took and its resources.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from deepinfer_sm80.ops.mhc.compile import KernelVariant, cuda_target, get_kernel
from deepinfer_sm80.ops.mhc.geometry import (
    HC_MULT,
    HIDDEN,
    SINKHORN_ITERS,
    TC_MIN_TOKENS,
)

logger = logging.getLogger("deepinfer_sm80.mhc")

TILELANG_SUBDIR = "tilelang"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class MhcModelConfig:
    """The model constants the epilogue is compiled with (DeepSeek-V4.1-Flash defaults)."""

    hidden_size: int = HIDDEN
    hc_mult: int = HC_MULT
    rms_norm_eps: float = 1e-20  # config.rms_norm_eps: mixes' RMS and attn/ffn RMSNorm
    hc_eps: float = 1e-6  # config.hc_eps: pre eps and Sinkhorn eps
    hc_post_mult_value: float = 2.0  # hard-coded in vLLM
    sinkhorn_iters: int = SINKHORN_ITERS


def shipped_variants(
    max_num_batched_tokens: int, model: MhcModelConfig = MhcModelConfig()
) -> list[KernelVariant]:
    """Every variant a server with this token budget launches, smallest first."""
    from deepinfer_sm80.ops.mhc.ops import (
        epilogue_variant,
        fused_variant,
        partial_rows,
        post_variant,
    )

    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens: expected >= 1, got {max_num_batched_tokens}")
    h, hc = model.hidden_size, model.hc_mult
    # Token counts from TC_MIN_TOKENS on all share one variant per kernel.
    counts = range(1, min(max_num_batched_tokens, TC_MIN_TOKENS) + 1)
    variants = list(dict.fromkeys(fused_variant(t, h, hc) for t in counts))
    for rows in dict.fromkeys(partial_rows(t) for t in counts):
        variants.append(
            epilogue_variant(
                h,
                hc,
                rows,
                model.rms_norm_eps,
                model.hc_eps,
                model.hc_eps,
                model.hc_post_mult_value,
                model.sinkhorn_iters,
                model.rms_norm_eps,
            )
        )
    variants.append(post_variant(h, hc))
    return variants


def _log(msg: str) -> None:
    logger.info(msg)


def warmup_mhc_kernels(
    max_num_batched_tokens: int,
    model: MhcModelConfig = MhcModelConfig(),
    target: dict | str = "auto",
    log=_log,
) -> list[dict]:
    """Compile (or load from the TileLang cache) every shipped variant; one log line each."""
    records = []
    t_all = time.perf_counter()
    for variant in shipped_variants(max_num_batched_tokens, model):
        t0 = time.perf_counter()
        get_kernel(variant, target)
        dt = time.perf_counter() - t0
        records.append({"variant": variant.label, "target": str(target), "seconds": dt})
        log(f"mHC kernel {variant.label} for {target}: ready in {dt:.2f} s")
    log(
        f"mHC: {len(records)} kernel variants ready in {time.perf_counter() - t_all:.1f} s "
        f"(max_num_batched_tokens={max_num_batched_tokens})"
    )
    return records


def seed_tilelang_cache(aot_dir: Path | str, cache_dir: Path | str | None = None) -> int:
    """Copy AOT cache entries missing from the live TileLang cache; returns how many.

    Never overwrites: an entry already there was compiled by this TileLang on this host.
    """
    src = Path(aot_dir) / TILELANG_SUBDIR
    if not src.is_dir():
        return 0
    if cache_dir is None:
        from tilelang import env

        cache_dir = env.TILELANG_CACHE_DIR
    dst_root = Path(cache_dir)
    copied = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_dir() or any(part in ("tmp", ".staging") for part in rel.parts):
            continue
        target = dst_root / rel
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.seeding")
        shutil.copy2(path, tmp)
        os.replace(tmp, target)  # atomic: concurrent workers never see half a file
        copied += 1
    return copied


def prepare_mhc_kernels(
    max_num_batched_tokens: int,
    aot_dir: Path | str | None = None,
    model: MhcModelConfig = MhcModelConfig(),
    log=_log,
) -> list[dict]:
    """What the plugin calls at startup: seed from the AOT folder, then warm every variant."""
    if aot_dir is not None:
        n = seed_tilelang_cache(aot_dir)
        log(f"mHC: seeded {n} TileLang cache files from {aot_dir}")
    return warmup_mhc_kernels(max_num_batched_tokens, model, "auto", log)


# --- Ampere fitness: registers, spills and shared memory from nvcc/ptxas -----------------

_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _dynamic_smem_bytes(kernel, variant: KernelVariant, target: dict) -> int:
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


def _ptxas_verbose(source: str, cc: int, extra_flags: list[str]) -> str:
    """nvcc -cubin -Xptxas -v on TileLang's generated CUDA source, with its include paths."""
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
            f"-arch=sm_{cc}",
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
    if run.returncode != 0:
        raise RuntimeError(f"nvcc failed for sm_{cc}: {run.stderr.strip()[-2000:]}")
    return run.stdout + run.stderr


def fit_report(variant: KernelVariant, cc: int):
    """Compile ``variant`` for ``sm_{cc}`` (through the TileLang cache) and measure it."""
    from deepinfer_sm80.testing.ampere_fit import FitReport

    arch = f"sm_{cc}"
    target = cuda_target(cc)
    try:
        t0 = time.perf_counter()
        kernel = get_kernel(variant, target)
        compile_s = time.perf_counter() - t0
        flags = list(variant.pass_configs().get(_device_flags_key(), []))
        text = _ptxas_verbose(kernel.get_kernel_source(), cc, flags)
        regs = _PTXAS_REGS.search(text)
        spill = _PTXAS_SPILL.search(text)
        static = _PTXAS_SMEM.search(text)
        if regs is None or spill is None:
            raise RuntimeError(f"could not parse ptxas -v output: {text.strip()[-1000:]}")
        smem = _dynamic_smem_bytes(kernel, variant, target) + (
            int(static.group(1)) if static else 0
        )
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
        )
        return report, compile_s
    except Exception as exc:  # noqa: BLE001 -- every failure becomes a report line
        msg = f"{type(exc).__name__}: {exc}"
        return FitReport(variant.label, arch, None, None, None, None, error=msg[:2000]), 0.0


def _device_flags_key():
    import tilelang

    return tilelang.PassConfigKey.TL_DEVICE_COMPILE_FLAGS


def compile_into_cache(dest: Path, variants, ccs, log, what: str) -> tuple[list, list[dict]]:
    """Compile ``variants`` (anything with ``build()``, ``pass_configs()``, ``label``,
    ``threads()``) for each ``sm_{cc}`` into ``dest/tilelang``, a TileLang cache folder,
    measuring each build. Returns the fit reports and one manifest row per build."""
    cache = Path(dest) / TILELANG_SUBDIR
    cache.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TILELANG_CACHE_DIR")
    os.environ["TILELANG_CACHE_DIR"] = str(cache)  # TileLang reads it on every lookup
    reports, rows = [], []
    try:
        for cc in ccs:
            for variant in variants:
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


def aot_build(
    dest: Path | str,
    ccs: list[int] = (80, 86),
    max_num_batched_tokens: int = 8192,
    model: MhcModelConfig = MhcModelConfig(),
    log=_log,
) -> dict:
    """Compile every shipped variant for each ``sm_{cc}`` into ``dest``; raise if one misfits."""
    from deepinfer_sm80.testing.ampere_fit import fit_violations

    dest = Path(dest)
    reports, rows = compile_into_cache(
        dest, shipped_variants(max_num_batched_tokens, model), ccs, log, "mHC"
    )
    manifest = {
        "arches": [f"sm_{cc}" for cc in ccs],
        "max_num_batched_tokens": max_num_batched_tokens,
        "model": asdict(model),
        "kernels": rows,
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    problems = fit_violations(reports)
    if problems:
        raise RuntimeError("mHC AOT kernels do not fit Ampere:\n" + "\n".join(problems))
    return manifest


def _parse_arches(text: str) -> list[int]:
    ccs = []
    for item in text.replace(",", " ").split():
        major, _, minor = item.partition(".")
        if major != "8" or not minor.isdigit():
            raise ValueError(f"--arches: {item!r} is not an Ampere capability; use 8.0 and/or 8.6")
        ccs.append(80 + int(minor))
    if not ccs:
        raise ValueError('--arches: empty; use "8.0 8.6"')
    return ccs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepinfer_sm80.ops.mhc.warmup")
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("aot", help="compile every shipped mHC kernel for Ampere into DEST")
    a.add_argument("dest", type=Path)
    a.add_argument("--arches", default="8.0 8.6")
    a.add_argument("--max-num-batched-tokens", type=int, default=8192)
    s = sub.add_parser("seed", help="copy AOT entries from SRC into the TileLang cache")
    s.add_argument("src", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "aot":
        try:
            manifest = aot_build(
                args.dest, _parse_arches(args.arches), args.max_num_batched_tokens, log=print
            )
        except (ValueError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{args.dest}: {len(manifest['kernels'])} kernel builds for {manifest['arches']}")
        return 0
    print(f"seeded {seed_tilelang_cache(args.src)} TileLang cache files from {args.src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
