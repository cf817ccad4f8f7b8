"""DSpark over PP: the sampled-token post-update never compiles a new kernel mid-serving.

With PP > 1 the last stage broadcasts each step's sampled tokens and accept counts to
the other stages (``PPHandler``, ``vllm/v1/worker/gpu/pp_utils.py``), which apply them
``pp_size`` steps later with vLLM's Triton ``_post_update_kernel``. Triton compiles one
variant per *specialization*: 16-byte alignment of every pointer, integers equal to 1,
``None`` arguments. In 0.33.0 two of them change with the traffic:

- the sampled-token width alternates between 1 (no drafts in the batch) and K+1, and
  Triton specializes the row stride ``== 1``;
- the accept counts arrive as one ``[2, num_reqs]`` int32 buffer, so the rejected-count
  row starts 16-byte aligned only when ``num_reqs % 4 == 0``.

A variant first met while serving compiles, and loading its CUDA module waits behind
NCCL kernels still spinning on the side stream: the hang reported upstream for DSpark
with PP (vLLM #53577 and #56956, and #53402 on an SM86 fork). The plugin closes the
variant set and compiles it
before serving:

- ``SteadyPPHandler`` (ledger entry ``pp-broadcast-steady``) is vLLM's ``PPHandler``
  whose consumed outputs always have rows ``max_sample_len`` wide and 16-byte-aligned
  count vectors (a small copy on the main stream after the receive event, outside any
  CUDA graph). The wire format is untouched, so every rank still agrees on it.
- ``prewarm_post_update`` runs the runner's own ``postprocess_sampled`` on non-last
  ranks with every request index -1 (the kernel returns before touching any state),
  without and with drafts (the only two variants left), from both wire widths and count
  alignments so the copies' kernels load too. The plugin's kernel warmup calls it
  before vLLM's warmup drives real PP steps; vLLM skips that warmup when JIT warmup is
  off (``--enforce-eager``), and the handler then says so in the log.

Not verified here: whether 0.33.0 hangs without this (that needs 3+ GPUs and DSpark
traffic). What is tested on CPU: the outputs are equivalent for the kernel (vLLM's own
``post_update`` under the interpreter) and Triton's sm_80 binder gives one
specialization for all of them where vLLM's gives several.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from vllm.v1.worker.gpu.pp_utils import PPHandler

logger = logging.getLogger("deepinfer_sm80.pp_broadcast")

ALIGN_BYTES = 16  # Triton's pointer-divisibility specialization


def steady_outputs(outputs: dict, width: int) -> dict:
    """``outputs`` of ``get_prev_sampled_outputs`` with a fixed kernel specialization:
    ``sampled_tokens`` widened to ``width`` columns (extra columns are never read:
    the kernel reads ``num_sampled`` of them) and misaligned count vectors copied."""
    sampled = outputs["sampled_tokens"]
    if sampled.dim() != 2 or sampled.shape[1] > width:
        raise ValueError(
            f"sampled_tokens: expected [num_reqs, <= {width}], got {tuple(sampled.shape)}"
        )
    steady = dict(outputs)
    if sampled.shape[1] < width or not sampled.is_contiguous():
        wide = sampled.new_zeros((sampled.shape[0], width))
        wide[:, : sampled.shape[1]] = sampled
        steady["sampled_tokens"] = wide
    for key in ("num_sampled", "num_rejected"):
        counts = outputs[key]
        if counts.data_ptr() % ALIGN_BYTES or not counts.is_contiguous():
            steady[key] = counts.clone(memory_format=torch.contiguous_format)
    return steady


class SteadyPPHandler(PPHandler):
    """vLLM's ``PPHandler`` whose consumed outputs keep one kernel specialization."""

    def __init__(self, max_num_reqs: int, num_speculative_steps: int, device: torch.device):
        super().__init__(max_num_reqs, num_speculative_steps, device)
        if self.is_last_rank or num_speculative_steps == 0:
            return
        from vllm.config import get_current_vllm_config

        kernel_config = getattr(get_current_vllm_config(), "kernel_config", None)
        if not getattr(kernel_config, "enable_jit_warmup", True):
            # vLLM calls the kernel warmup (where prewarm_post_update runs) only with
            # JIT warmup on; --enforce-eager turns it off.
            logger.warning(
                "deepinfer-sm80: JIT warmup is off (e.g. --enforce-eager), so the PP "
                "post-update kernel is not pre-warmed and compiles at its first use "
                "while serving, the condition of the DSpark-over-PP hang in vLLM #56956"
            )

    def get_prev_sampled_outputs(self):
        outputs = super().get_prev_sampled_outputs()
        if outputs is None:
            return None
        return steady_outputs(outputs, self.max_sample_len)


def prewarm_post_update(model_runner, num_reqs: int = 4) -> int:
    """Compile the post-update variants a non-last PP rank will launch, before serving.
    Returns how many were launched (0 on the last rank or without PP)."""
    handler = getattr(model_runner, "pp_handler", None)
    if not isinstance(handler, SteadyPPHandler) or handler.is_last_rank:
        return 0  # no PP, the last rank, or the pp-broadcast-steady entry not applied
    device = model_runner.device
    width, steps = handler.max_sample_len, handler.num_speculative_steps
    start = time.perf_counter()
    launches = 0
    # The received shapes as they come off the wire: one sampled column or K+1, an
    # aligned or an unaligned count row (num_reqs 4 vs 5). steady_outputs' widening and
    # copy kernels load here too (CUDA loads modules lazily), not behind NCCL later.
    for wire_width, num_reqs in dict.fromkeys(((1, 5), (width, 4))):
        # Every row skipped (idx -1): the kernel returns before reading or writing state.
        idx_mapping = torch.from_numpy(np.full(num_reqs, -1, dtype=np.intp)).to(device)
        counts = torch.zeros(2, num_reqs, dtype=torch.int32, device=device)
        sampled = torch.zeros(num_reqs, wire_width, dtype=torch.int64, device=device)
        drafts = [None] + ([sampled.new_zeros(num_reqs, steps)] if steps > 0 else [])
        for draft_tokens in drafts:
            outputs = steady_outputs(
                dict(
                    sampled_tokens=sampled,
                    num_sampled=counts[0],
                    num_rejected=counts[1],
                    idx_mapping=idx_mapping,
                    draft_tokens=draft_tokens,
                ),
                width,
            )
            model_runner.postprocess_sampled(**outputs)
            launches += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the compile time lands here, not on a request
    logger.info(
        "deepinfer-sm80: PP post-update pre-warmed (%d launches, %.1f s)",
        launches,
        time.perf_counter() - start,
    )
    return launches
