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
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from deepinfer_sm80.ampere_fit import fit_violations
from deepinfer_sm80.arch import parse_ampere_arches
from deepinfer_sm80.ops.mhc.compile import KernelVariant
from deepinfer_sm80.ops.mhc.geometry import (
    HC_MULT,
    HIDDEN,
    SINKHORN_ITERS,
    TC_MIN_TOKENS,
)
from deepinfer_sm80.tilelang_build import (
    MANIFEST,
    compile_into_cache,
    get_kernel,
    seed_tilelang_cache,
)

logger = logging.getLogger("deepinfer_sm80.mhc")


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


def ampere_kernel_specs(max_num_batched_tokens: int = 8192):
    """The shipped compile configs (``compile.KernelVariant``s) for the Ampere fitness tier.

    TileLang kernels do not fit ``kernel_spec.KernelSpec`` (a Triton launch);
    ``tilelang_build.fit_report(variant, cc)`` turns each into an ``ampere_fit.FitReport`` that
    ``ampere_fit.fit_violations`` checks like any other.
    """
    return shipped_variants(max_num_batched_tokens)


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


def aot_build(
    dest: Path | str,
    ccs: list[int] = (80, 86),
    max_num_batched_tokens: int = 8192,
    model: MhcModelConfig = MhcModelConfig(),
    log=_log,
) -> dict:
    """Compile every shipped variant for each ``sm_{cc}`` into ``dest``; raise if one misfits."""
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
                args.dest, parse_ampere_arches(args.arches), args.max_num_batched_tokens, log=print
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
