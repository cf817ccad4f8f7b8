"""Our kernels' warmup, run inside vLLM's own kernel warmup (before the server is ready).

vLLM's worker calls ``warmup_kernels`` once the KV cache is sized and before it reports
ready; its scheduler-realistic steps JIT-compile the Triton kernels they touch. The mHC
TileLang kernels are compiled per token-count bucket, and those steps touch only a few
buckets, so ours first compiles (or loads, seeding from the image's AOT folder) every
variant up to ``max_num_batched_tokens`` and logs what it compiled and how long it took.
Then vLLM's warmup runs unchanged.

vLLM's steps are a few tokens long, so every query selects its whole short history and
the scored paths -- the indexer's prefill logits, the compressed-KV gather, the top-k and
window merge -- would compile on the first long prompt instead (seconds, in front of that
user). One mixed prefill+decode step long enough to take them follows (``warm_long_prefill``).
"""

from __future__ import annotations

import logging
import time

from vllm.v1.worker.gpu.warmup import run_mixed_prefill_decode_warmup
from vllm.v1.worker.gpu.warmup import warmup_kernels as _vllm_warmup_kernels

from deepinfer_sm80 import envs

logger = logging.getLogger("deepinfer_sm80.warmup")


def _mhc_model_config(hf_config):
    from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig

    default = MhcModelConfig()
    return MhcModelConfig(
        rms_norm_eps=getattr(hf_config, "rms_norm_eps", default.rms_norm_eps),
        hc_eps=getattr(hf_config, "hc_eps", default.hc_eps),
        sinkhorn_iters=getattr(hf_config, "hc_sinkhorn_iters", default.sinkhorn_iters),
    )


def warm_overlay_kernels(model_runner) -> list[dict]:
    """Compile every mHC and sparse-MLA decode variant this server can launch. Returns
    the per-variant log."""
    from deepinfer_sm80 import aot
    from deepinfer_sm80.ops.mhc.warmup import prepare_mhc_kernels

    max_tokens = int(model_runner.scheduler_config.max_num_batched_tokens)
    aot_dir = envs.get("DEEPINFER_AOT_DIR")
    start = time.perf_counter()
    records = prepare_mhc_kernels(
        max_tokens,
        aot_dir=aot.tilelang_aot_dir(aot_dir, aot.MHC_SUBDIR),
        model=_mhc_model_config(model_runner.model_config.hf_config),
        log=logger.info,
    )
    logger.info(
        "deepinfer-sm80: %d mHC kernel variants ready in %.1f s (up to %d tokens)",
        len(records),
        time.perf_counter() - start,
        max_tokens,
    )
    # The sparse-MLA decode and prefill kernels (TileLang) too, so no compile lands in a
    # CUDA-graph capture or a first request; skipped where the Triton kernels run.
    import torch

    from deepinfer_sm80.ops.sparse_mla import tilelang_kernels
    from deepinfer_sm80.ops.sparse_mla.engine import decode_engine, prefill_engine

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    decode = decode_engine(device)
    if "tilelang" in (decode, prefill_engine(device)):
        records += tilelang_kernels.warmup(
            log=logger.info, aot_dir=aot.tilelang_aot_dir(aot_dir, aot.SPARSE_MLA_SUBDIR)
        )
    if decode == "tilelang":
        # The in-kernel split merge's counters, sized before vLLM captures CUDA graphs.
        tilelang_kernels.reserve_split_counters(device, max_tokens)
    return records


def long_prefill_tokens(hf_config) -> int:
    """Tokens of one prefill that takes every scored path; 0 when the model has none.

    A layer of compress ratio r scores its candidates with the indexer only once
    ``seq_len // r > index_topk`` (below that every candidate is selected,
    deepseek_v41/attention.py); the largest ratio sets the length, one more compressed
    entry makes it strict, and a full sliding window on top puts the window merge past
    its edge too.
    """
    ratios = [int(r) for r in getattr(hf_config, "compress_ratios", None) or () if int(r) > 0]
    topk = getattr(hf_config, "index_topk", None)
    if not ratios or not topk:
        return 0
    largest = max(ratios)
    return int(topk) * largest + largest + int(getattr(hf_config, "sliding_window", 0) or 0)


def warm_long_prefill(model_runner, worker_execute_model, worker_sample_tokens) -> int:
    """Run one mixed step whose prefill is ``long_prefill_tokens`` long, through vLLM's own
    scheduler-input path (every PP rank runs it, as vLLM's warmup steps). Returns the
    tokens it ran, 0 when skipped (with the reason logged)."""
    prefill = long_prefill_tokens(model_runner.model_config.hf_config)
    if prefill == 0:
        return 0
    # vLLM's mixed step schedules one decode token beside the prefill.
    tokens = prefill + 1
    # (what it needs, the server's limit): vLLM's mixed step also feeds the prefill the
    # token ids 0 .. prefill - 1, so a vocabulary smaller than that (a smoke checkpoint's
    # 256) would index the embedding out of bounds: a device-side assert at server start.
    limits = {
        "max_num_batched_tokens": (tokens, model_runner.scheduler_config.max_num_batched_tokens),
        "max_model_len": (tokens, model_runner.max_model_len),
        "vocab_size": (prefill, model_runner.model_config.get_vocab_size()),
    }
    for name, (needed, limit) in limits.items():
        if needed > int(limit):
            logger.warning(
                "deepinfer-sm80: long-prefill warmup skipped: it needs %s >= %d and %s is "
                "%d; the first prompt over %d tokens compiles the scored prefill kernels "
                "instead",
                name,
                needed,
                name,
                int(limit),
                prefill,
            )
            return 0
    start = time.perf_counter()
    if not run_mixed_prefill_decode_warmup(
        model_runner,
        worker_execute_model,
        worker_sample_tokens,
        tokens,
        req_id_prefix="_deepinfer_long_prefill_warmup",
    ):
        logger.warning(
            "deepinfer-sm80: long-prefill warmup skipped by vLLM (fewer than 2 sequences "
            "or too few KV blocks); the first prompt over %d tokens compiles the scored "
            "prefill kernels instead",
            prefill,
        )
        return 0
    logger.info(
        "deepinfer-sm80: long-prefill warmup (%d tokens) done in %.1f s",
        tokens,
        time.perf_counter() - start,
    )
    return tokens


def warmup_kernels(model_runner, worker_execute_model, worker_sample_tokens) -> None:
    """vLLM's ``warmup_kernels`` with our kernels compiled first (same signature), on
    non-last PP ranks the sampled-token post-update (``pp_broadcast``), and one long
    prefill after vLLM's short steps."""
    from deepinfer_sm80.vllm_plugin.pp_broadcast import prewarm_post_update

    warm_overlay_kernels(model_runner)
    prewarm_post_update(model_runner)
    _vllm_warmup_kernels(model_runner, worker_execute_model, worker_sample_tokens)
    warm_long_prefill(model_runner, worker_execute_model, worker_sample_tokens)
