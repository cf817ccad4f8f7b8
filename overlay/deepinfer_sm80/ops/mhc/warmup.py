"""Every mHC kernel a server launches: the shipped variants and their startup warmup.

Startup (the plugin calls this once per worker, before the first forward)::

    from deepinfer_sm80.ops.mhc.warmup import prepare_mhc_kernels
    prepare_mhc_kernels(max_num_batched_tokens, aot_dir="/opt/deepinfer/kernels/mhc")

It copies AOT-built entries into the live TileLang cache (never overwriting), then asks
for every variant the token-count buckets up to ``max_num_batched_tokens`` need; each
one is either loaded from the cache or compiled, and one log line says which and how long.

Ahead of time (image build, no GPU), ``python -m deepinfer_sm80.aot build`` compiles
``shipped_variants()`` for sm_80 and sm_86 into ``DEEPINFER_AOT_DIR/mhc`` and checks each
against the Ampere budget (``deepinfer_sm80.tilelang_build.aot_build``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from deepinfer_sm80.ops.mhc.geometry import (
    HC_MULT,
    HIDDEN,
    SINKHORN_ITERS,
    TC_MIN_TOKENS,
)
from deepinfer_sm80.ops.mhc.variants import KernelVariant
from deepinfer_sm80.tilelang_build import warm

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


def _log(msg: str) -> None:
    logger.info(msg)


def prepare_mhc_kernels(
    max_num_batched_tokens: int,
    aot_dir: Path | str | None = None,
    model: MhcModelConfig = MhcModelConfig(),
    log=_log,
) -> list[dict]:
    """What the plugin calls at startup: seed from the AOT folder (when it exists), then
    compile or load every shipped variant, one log line each."""
    return warm(shipped_variants(max_num_batched_tokens, model), "mHC", aot_dir, "auto", log)
