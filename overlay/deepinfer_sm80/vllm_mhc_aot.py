"""vLLM's own mHC pre-norm TileLang kernels, compiled ahead of time for the keys a server compiles.

Our plugin routes the fused post + pre-norm mixing and the post mixing onto our kernels, but
vLLM 0.33.0's DeepSeek-V4.1 still runs its own pre-norm path (``mhc_pre_delayed_tilelang``)
at the first layer and around the Engram layers. Two of its TileLang kernels compile with
nvcc on a cold server:

- the epilogue, ``mhc_pre_big_fuse_with_norm_tilelang``: every decoder layer registers its
  compile keys for vLLM's JIT warmup (``models/deepseek_v41/nvidia/model.py``, the
  ``MHC_PRE_NORM_KERNEL.register_warmup`` loop), which compiles them before the server is
  ready;
- the projection GEMM, ``hc_prenorm_gemm_tilelang`` and its ``block_m`` form, where DeepGEMM
  is unsupported (below sm_90: Ampere). Nothing registers it for the warmup: a server
  compiles each of its keys when the first batch of that size class reaches it (the memory
  profiling run, CUDA graph capture, the first requests). V4.1 passes it the sublayer's
  input width with ``hc_mult`` 1: the broadcast embedding's hidden size at the first layer,
  the full stream's ``hc_mult x hidden`` after.

Built here into a TileLang cache folder (``deepinfer_sm80.aot``'s ``vllm_mhc`` part) and
seeded by the plugin, both load from disk instead.

A build is found only if its TileLang cache key equals the server's: the kernel's TIR for
the key, the target, the execution backend and the pass configs. Three things make that hold
on a build machine without a GPU:

- ``warmup_keys`` asks vLLM's own ``get_warmup_keys`` for every variant the decoder layer
  registers, with vLLM's sweep shown the server's GPU instead of the build machine's
  (``sweep_as_on``). Below sm_100 a layer registers the fused split mode alone (the
  shifted-mHC stream needs sm_100). Where DeepGEMM is unsupported (Ampere) the token sweep
  adds no splits: the keys do not depend on the token budget there. Where it runs (sm_90,
  the ``--hopper-proxy`` build) the sweep adds the splits its estimator picks from the
  GPU's SM count, ``HOPPER_PROXY_SMS``: a proxy folder built on a machine without a GPU
  holds the keys an H100 or H200 server compiles, and an Ampere folder built on a Hopper
  machine holds Ampere's.
  ``prenorm_gemm_keys`` asks the GEMM's own ``get_warmup_keys``, whose sweep over the token
  count follows its runtime dispatch (below 128 tokens, below 1,024, and from 1,024 on).
  The GEMM's token count is a symbolic dimension: one build serves every count of its class.
- ``server_kernel`` and ``server_prenorm_gemm`` decorate vLLM's kernel functions again with
  TileLang's language bound: off CUDA, vLLM imports its TileLang kernels with ``T`` unset,
  so its own decorated kernels know no tensor arguments and cannot elaborate. Each variant
  elaborates with vLLM's ``ENABLE_PDL`` as the server's GPU sets it (from sm_90 the
  kernels wait on and trigger programmatic dependent launch, which changes their TIR): an
  sm_90 variant is built for sm_90 alone, an Ampere one for Ampere alone.
- ``CUDA_PASS_CONFIGS`` are the pass configs vLLM gives its TileLang kernels on a CUDA
  platform (``vllm.tilelang_utils._get_pass_configs``); off CUDA it leaves one out.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any
from unittest import mock

from deepinfer_sm80.arch import AMPERE_CCS
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


def _as_on_cuda(jit_kernel):
    """vLLM's TileLang kernel ``jit_kernel`` decorated again as on a CUDA server."""
    import tilelang
    import tilelang.language

    function = jit_kernel.func.orig_func
    # The names its body reads from its module, as vLLM binds them on a CUDA platform.
    function.__globals__["T"] = tilelang.language
    function.__globals__["tilelang"] = tilelang
    return tilelang.jit(pass_configs=cuda_pass_configs())(function)


@functools.cache
def server_kernel():
    """vLLM's ``mhc_pre_big_fuse_with_norm_tilelang`` as a CUDA server decorates it."""
    from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

    return _as_on_cuda(MHC_PRE_NORM_KERNEL.kernel)


@functools.cache
def server_prenorm_gemm(use_block_m: bool):
    """vLLM's ``hc_prenorm_gemm_tilelang`` (``hc_prenorm_gemm_block_m_tilelang`` with
    ``use_block_m``) as a CUDA server decorates it."""
    from vllm.model_executor.kernels.mhc import tilelang_kernels

    if use_block_m:
        return _as_on_cuda(tilelang_kernels.hc_prenorm_gemm_block_m_tilelang)
    return _as_on_cuda(tilelang_kernels.hc_prenorm_gemm_tilelang)


# DeepGEMM runs vLLM's pre-norm GEMM from sm_90 on (vllm.utils.deep_gemm); below it, the
# TileLang GEMM compiles.
DEEPGEMM_MIN_CC = 90
# vLLM's single-pass fused post + pre-norm GEMM config needs sm_100
# (tilelang_kernels._fused_post_pre_single_pass_supported).
SINGLE_PASS_MIN_CC = 100
# The SM count a --hopper-proxy build's sweep assumes: H100 SXM5 and H200 both have 132.
HOPPER_PROXY_SMS = 132
# vLLM's TileLang mHC kernels use programmatic dependent launch on CUDA from sm_90
# (tilelang_kernels.ENABLE_PDL, from the platform's is_arch_support_pdl: major >= 9).
PDL_MIN_CC = 90


@contextlib.contextmanager
def sweep_as_on(cc: int, sms: int = HOPPER_PROXY_SMS) -> Iterator[None]:
    """vLLM's mHC warmup sweep as it runs on a server GPU of compute capability ``cc`` with
    ``sms`` SMs, whatever GPU this machine has (or none): the three things the sweep reads
    from the machine (DeepGEMM support, the SM count its split estimator divides, the
    single-pass fused GEMM's capability check) answer for that GPU."""
    import torch
    from vllm.model_executor.kernels.mhc import tilelang_kernels
    from vllm.model_executor.kernels.mhc import warmup as vllm_warmup

    props = SimpleNamespace(multi_processor_count=sms)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(
            vllm_warmup, "is_deep_gemm_supported", lambda: cc >= DEEPGEMM_MIN_CC
        ))  # fmt: skip
        stack.enter_context(mock.patch.object(
            tilelang_kernels, "_fused_post_pre_single_pass_supported",
            lambda: cc >= SINGLE_PASS_MIN_CC,
        ))  # fmt: skip
        stack.enter_context(mock.patch.object(
            torch.cuda, "get_device_properties", lambda device=None: props
        ))  # fmt: skip
        yield


def warmup_keys(model: MhcModelConfig, max_num_batched_tokens: int, cc: int = 80) -> list[Any]:
    """The compile keys DeepSeek-V4.1's decoder layers register for vLLM's JIT warmup of
    its mHC pre-norm kernel on a server GPU of compute capability ``cc`` (sm_90: an H100 or
    H200, ``HOPPER_PROXY_SMS``), with speculative decoding's aux variant included (a server
    without a draft model registers a subset)."""
    with sweep_as_on(cc):
        return registered_keys(model, max_num_batched_tokens)


def registered_keys(model: MhcModelConfig, max_num_batched_tokens: int) -> list[Any]:
    """``warmup_keys`` as vLLM's sweep finds them on this machine, its GPU (or none) as it is."""
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


class _VllmVariant:
    """What a compile key of one of vLLM's kernels needs besides ``label`` and ``tir`` to
    be a TileLang variant (``tilelang_build``): its TIR as a server GPU with or without
    PDL (``pdl``) elaborates it, built for those GPUs alone; vLLM's CUDA pass configs; and
    its block size."""

    pdl: bool
    kernel: str  # the label's name for vLLM's kernel

    def key_fields(self) -> str: ...

    def tir(self): ...

    @property
    def label(self) -> str:
        return f"vllm.{self.kernel}[{self.key_fields()}" + (",pdl]" if self.pdl else "]")

    def build(self):
        # vLLM's kernels read ENABLE_PDL as they elaborate: set it as the server GPU has it,
        # whatever this machine is.
        from vllm.model_executor.kernels.mhc import tilelang_kernels

        with mock.patch.object(tilelang_kernels, "ENABLE_PDL", self.pdl):
            return self.tir()

    def builds_for(self, cc: int) -> bool:
        """Whether a server on ``sm_{cc}`` elaborates this variant's TIR (PDL from sm_90)."""
        return self.pdl == (cc >= PDL_MIN_CC)

    def pass_configs(self) -> dict:
        return cuda_pass_configs()

    def threads(self) -> int:
        """Threads per CTA, read from the TIR's thread bindings."""
        extents = [int(n) for n in _THREAD_BINDING.findall(self.build().script())]
        if not extents:
            raise ValueError(f"{self.label}: no threadIdx binding in its TIR")
        return math.prod(extents)


@dataclass(frozen=True)
class VllmMhcPreNormVariant(_VllmVariant):
    """One compile key of vLLM's mHC pre-norm epilogue as a TileLang variant."""

    key: Any  # vLLM's MHCPreNormKernel.CompileKey
    pdl: bool = False
    kernel = "mhc_pre_norm"

    def key_fields(self) -> str:
        k = self.key
        return (
            f"numel{k.rms_numel},s{k.n_splits},premix{int(k.use_pre_mix_in)},"
            f"aux{int(k.write_aux)},{k.split_mode}"
        )

    def tir(self):
        return server_kernel().get_tir(**asdict(self.key))


def prenorm_gemm_keys(model: MhcModelConfig, max_num_batched_tokens: int) -> list[Any]:
    """The compile keys of vLLM's pre-norm GEMM that a server without DeepGEMM reaches: for
    each input width V4.1 passes (the broadcast embedding's and the full stream's, with
    ``hc_mult`` 1), one per token-count class up to the token budget."""
    from vllm.model_executor.kernels.mhc.tilelang_kernels import (
        _HC_PRENORM_GEMM_TILELANG_KERNEL as GEMM,
    )

    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens: expected >= 1, got {max_num_batched_tokens}")
    h, hc = model.hidden_size, model.hc_mult
    # get_warmup_keys reads the budget from a vLLM config; only this field.
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_num_batched_tokens)
    )
    keys = []
    for width in (h, hc * h):
        keys += GEMM.get_warmup_keys(config, hidden_size=width, hc_mult=1, n_out=hc * (hc + 2))
    return list(dict.fromkeys(keys))


@dataclass(frozen=True)
class VllmPrenormGemmVariant(_VllmVariant):
    """One compile key of vLLM's pre-norm GEMM as a TileLang variant."""

    key: Any  # vLLM's HcPrenormGemmTileLangKernel.CompileKey
    pdl: bool = False
    kernel = "hc_prenorm_gemm"

    def key_fields(self) -> str:
        k = self.key
        form = f"block_m{k.block_m}" if k.use_block_m else f"s{k.n_splits}"
        return f"k{k.hidden_size * k.hc_mult},thr{k.n_thr},tile{k.tile_n},{form}"

    def tir(self):
        from vllm.model_executor.kernels.mhc.tilelang_kernels import (
            _HC_PRENORM_GEMM_TILELANG_KERNEL as GEMM,
        )

        k = self.key
        # vLLM's own stand-in tensors for the key, passed as its launch passes them (the
        # last argument is block_m in the block_m form, n_splits otherwise).
        t = GEMM.warmup_inputs(k)
        last = k.block_m if k.use_block_m else k.n_splits
        return server_prenorm_gemm(k.use_block_m).get_tir(
            t["x"], t["fn"], t["out"], t["sqrsum"], k.hidden_size, k.hc_mult, k.n_out,
            k.n_thr, k.tile_n, last,
        )  # fmt: skip


def shipped_variants(
    model: MhcModelConfig, max_num_batched_tokens: int, ccs: tuple[int, ...] = AMPERE_CCS
):
    """What the ``vllm_mhc`` part builds for ``ccs``, each variant once: the epilogue's
    warmup keys of each of ``ccs``, with or without PDL as that GPU elaborates them, and
    the GEMM's keys where one of ``ccs`` runs it (below ``DEEPGEMM_MIN_CC``, so without
    PDL)."""
    variants: list = [
        VllmMhcPreNormVariant(k, pdl=cc >= PDL_MIN_CC)
        for cc in ccs
        for k in warmup_keys(model, max_num_batched_tokens, cc)
    ]
    if any(cc < DEEPGEMM_MIN_CC for cc in ccs):
        variants += [
            VllmPrenormGemmVariant(k) for k in prenorm_gemm_keys(model, max_num_batched_tokens)
        ]
    return list(dict.fromkeys(variants))
