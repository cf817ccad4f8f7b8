"""vLLM's own mHC pre-norm TileLang kernel, compiled ahead of time for the keys its warmup asks for.

Our plugin routes the fused post + pre-norm mixing and the post mixing onto our kernels, but
vLLM 0.33.0's DeepSeek-V4.1 still runs its own pre-norm kernel
(``mhc_pre_big_fuse_with_norm_tilelang``) at the first layer and around the Engram layers,
and every decoder layer registers its compile keys for vLLM's JIT warmup
(``models/deepseek_v41/nvidia/model.py``, the ``MHC_PRE_NORM_KERNEL.register_warmup`` loop).
A cold server compiles each of them with nvcc before it is ready. Built here into a TileLang
cache folder (``deepinfer_sm80.aot``'s ``vllm_mhc`` part) and seeded by the plugin, the warmup
loads them from disk instead.

A build is found only if its TileLang cache key equals the server's: the kernel's TIR for
the key, the target, the execution backend and the pass configs. Three things make that hold
on a build machine without a GPU:

- ``warmup_keys`` asks vLLM's own ``get_warmup_keys`` for every variant the decoder layer
  registers. Below sm_100 a layer registers the fused split mode alone (the shifted-mHC
  stream needs sm_100), and where DeepGEMM is unsupported (Ampere, and a machine without a
  GPU) the token sweep adds no splits: the keys do not depend on the token budget there.
  On a Hopper GPU (the ``--hopper-proxy`` build runs there) vLLM's sweep reads the GPU.
- ``server_kernel`` decorates vLLM's kernel function again with TileLang's language bound:
  off CUDA, vLLM imports its TileLang kernels with ``T`` unset, so its own decorated kernel
  knows no tensor arguments and cannot elaborate.
- ``CUDA_PASS_CONFIGS`` are the pass configs vLLM gives its TileLang kernels on a CUDA
  platform (``vllm.tilelang_utils._get_pass_configs``); off CUDA it leaves one out.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig

# vLLM's TileLang pass configs on a CUDA platform, by name (tilelang.PassConfigKey values);
# tests/test_vllm_mhc_aot.py checks them against vLLM's own function.
CUDA_PASS_CONFIGS = {
    "tl.disable_warp_specialized": True,
    "tl.disable_tma_lower": True,
    "tl.ptxas_register_usage_level": 10,
}

_THREAD_BINDING = re.compile(r'T\.thread_binding\((\d+), thread="threadIdx\.[xyz]"\)')


def cuda_pass_configs() -> dict:
    """``CUDA_PASS_CONFIGS`` keyed as vLLM keys them (TileLang's ``PassConfigKey``)."""
    import tilelang

    return {tilelang.PassConfigKey(name): value for name, value in CUDA_PASS_CONFIGS.items()}


@functools.cache
def server_kernel():
    """vLLM's ``mhc_pre_big_fuse_with_norm_tilelang`` as a CUDA server decorates it."""
    import tilelang
    import tilelang.language
    from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

    function = MHC_PRE_NORM_KERNEL.kernel.func.orig_func
    # The names its body reads from its module, as vLLM binds them on a CUDA platform.
    function.__globals__["T"] = tilelang.language
    function.__globals__["tilelang"] = tilelang
    return tilelang.jit(pass_configs=cuda_pass_configs())(function)


def warmup_keys(model: MhcModelConfig, max_num_batched_tokens: int) -> list[Any]:
    """The compile keys DeepSeek-V4.1's decoder layers register for vLLM's JIT warmup of
    its mHC pre-norm kernel, with speculative decoding's aux variant included (a server
    without a draft model registers a subset)."""
    from vllm.model_executor.kernels.mhc.tilelang_kernels import mhc_fused_post_pre_splits
    from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens: expected >= 1, got {max_num_batched_tokens}")
    h, hc = model.hidden_size, model.hc_mult
    fields = dict(
        hidden_size=h,
        rms_eps=model.rms_norm_eps,
        hc_pre_eps=model.hc_eps,
        hc_sinkhorn_eps=model.hc_eps,
        hc_post_mult_value=model.hc_post_mult_value,
        sinkhorn_repeat=model.sinkhorn_iters,
        norm_eps=model.rms_norm_eps,
        hc_mult=hc,
        split_mode="fused",
        max_tokens=max_num_batched_tokens,
    )
    # The first layer collapses the broadcast embedding (one hidden-wide row); every later
    # sublayer the full stream, also reached through the fused post + pre-norm GEMM's splits.
    hc_stream = dict(rms_numel=hc * h, extra_splits=mhc_fused_post_pre_splits(h, hc))
    variants = [
        dict(rms_numel=h, use_pre_mix_in=False, extra_splits=()),
        dict(hc_stream, use_pre_mix_in=False),
        dict(hc_stream, use_pre_mix_in=True),
        dict(hc_stream, use_pre_mix_in=True, write_aux=True),
    ]
    keys = []
    for variant in variants:
        keys.extend(MHC_PRE_NORM_KERNEL.get_warmup_keys(**fields, **variant))
    return list(dict.fromkeys(keys))


@dataclass(frozen=True)
class VllmMhcPreNormVariant:
    """One compile key of vLLM's kernel as a TileLang variant (``tilelang_build``)."""

    key: Any  # vLLM's MHCPreNormKernel.CompileKey

    @property
    def label(self) -> str:
        k = self.key
        return (
            f"vllm.mhc_pre_norm[numel{k.rms_numel},s{k.n_splits},"
            f"premix{int(k.use_pre_mix_in)},aux{int(k.write_aux)},{k.split_mode}]"
        )

    def build(self):
        return server_kernel().get_tir(**asdict(self.key))

    def pass_configs(self) -> dict:
        return cuda_pass_configs()

    def threads(self) -> int:
        """Threads per CTA, read from the TIR's thread bindings."""
        extents = [int(n) for n in _THREAD_BINDING.findall(self.build().script())]
        if not extents:
            raise ValueError(f"{self.label}: no threadIdx binding in its TIR")
        return math.prod(extents)


def shipped_variants(model: MhcModelConfig, max_num_batched_tokens: int):
    return [VllmMhcPreNormVariant(k) for k in warmup_keys(model, max_num_batched_tokens)]
