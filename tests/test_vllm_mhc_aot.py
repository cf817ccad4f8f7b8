"""deepinfer_sm80.vllm_mhc_aot: vLLM's own mHC pre-norm kernel, built ahead of time for the
keys its JIT warmup compiles, is what vLLM's warmup loads on a server of that architecture."""

import ast
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from deepinfer_sm80 import aot, tilelang_build, vllm_mhc_aot
from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig

ROOT = Path(__file__).resolve().parents[1]


def test_pass_configs_are_vllms_on_a_cuda_platform(monkeypatch):
    """Off CUDA vLLM leaves its register-usage level out; a CUDA server's key holds it."""
    import vllm.tilelang_utils as tilelang_utils

    monkeypatch.setattr(tilelang_utils.current_platform, "is_cuda", lambda: True)
    assert tilelang_utils._get_pass_configs.__wrapped__() == vllm_mhc_aot.cuda_pass_configs()


def test_keys_are_what_an_ampere_server_registers():
    """Without DeepGEMM (Ampere) the warmup compiles split 1 for the broadcast
    embedding, and splits 1 and 8 (the fused post + pre-norm GEMM's) for the full stream
    without and with the carried pre-mix, and with the draft's aux output; any token
    budget gives the same keys."""
    model = MhcModelConfig()
    keys = vllm_mhc_aot.warmup_keys(model, 8192)
    h = model.hidden_size
    assert [(k.rms_numel, k.n_splits, k.use_pre_mix_in, k.write_aux) for k in keys] == [
        (h, 1, False, False),
        (4 * h, 1, False, False),
        (4 * h, 8, False, False),
        (4 * h, 1, True, False),
        (4 * h, 8, True, False),
        (4 * h, 1, True, True),
        (4 * h, 8, True, True),
    ]
    for k in keys:
        assert k.split_mode == "fused" and k.hidden_size == h and k.hc_mult == model.hc_mult
        assert (k.rms_eps, k.norm_eps) == (model.rms_norm_eps, model.rms_norm_eps)
        assert (k.hc_pre_eps, k.hc_sinkhorn_eps) == (model.hc_eps, model.hc_eps)
        assert k.sinkhorn_repeat == model.sinkhorn_iters and k.hc_post_mult_value == 2.0
    assert vllm_mhc_aot.warmup_keys(model, 64) == keys
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        vllm_mhc_aot.warmup_keys(model, 0)


H100_RECORD = ROOT / "benchmarks" / "results" / "NVIDIA_H100.vllm_mhc_aot_gpu_test.txt"


def _recorded_h100_labels() -> list[str]:
    """The labels of the keys vLLM's own sweep registered on an H100 (the gpu test's record)."""
    line = next(x for x in H100_RECORD.read_text().splitlines() if x.startswith("{'cc': 90"))
    return ast.literal_eval(line)["labels"]


def _labels(keys) -> list[str]:
    return [vllm_mhc_aot.VllmMhcPreNormVariant(k).label for k in keys]


def test_hopper_keys_built_without_a_gpu_are_the_ones_vllm_registered_on_an_h100():
    """A --hopper-proxy build on this machine (no GPU) asks for the 15 keys vLLM's live
    sweep registered on an H100 (DeepGEMM's splits 1/4/16 and the fused GEMM's 8), in its
    order; an H100 PCIe's 114 SMs give the same keys as the 132 assumed."""
    model = MhcModelConfig()
    hopper = vllm_mhc_aot.warmup_keys(model, 8192, 90)
    assert _labels(hopper) == _recorded_h100_labels()
    with vllm_mhc_aot.sweep_as_on(90, sms=114):
        assert vllm_mhc_aot.registered_keys(model, 8192) == hopper
    # A budget below one 64-token step of the sweep reaches fewer splits.
    assert len(vllm_mhc_aot.warmup_keys(model, 1, 90)) < len(hopper)


def test_keys_follow_the_server_gpu_not_the_build_machine(monkeypatch):
    """On a Hopper build machine (DeepGEMM present, 132 SMs) vLLM's sweep registers
    Hopper's keys, yet an Ampere build still asks for Ampere's; the machine is as it was
    once the sweep has run."""
    import torch
    from vllm.model_executor.kernels.mhc import warmup as vllm_warmup

    model = MhcModelConfig()
    ampere = vllm_mhc_aot.warmup_keys(model, 8192, 80)
    assert vllm_mhc_aot.registered_keys(model, 8192) == ampere  # this machine: no GPU
    monkeypatch.setattr(vllm_warmup, "is_deep_gemm_supported", lambda: True)
    props = SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    here = vllm_mhc_aot.registered_keys(model, 8192)
    assert _labels(here) == _recorded_h100_labels()
    assert vllm_mhc_aot.warmup_keys(model, 8192, 80) == ampere
    assert vllm_mhc_aot.registered_keys(model, 8192) == here  # the patches were undone


def test_prenorm_gemm_keys_are_what_a_server_without_deepgemm_dispatches():
    """One key per token-count class (below 128: 1,024 threads x 4 outputs; below 1,024:
    512 x 12; from 1,024: the block_m form) for the broadcast embedding's width and the full
    stream's; a budget below 128 tokens reaches only the first class. Each key is what
    vLLM's own dispatch picks for a batch of that size."""
    from vllm.model_executor.kernels.mhc.tilelang_kernels import (
        _HC_PRENORM_GEMM_TILELANG_KERNEL as GEMM,
    )

    model = MhcModelConfig()
    h, hc = model.hidden_size, model.hc_mult
    keys = vllm_mhc_aot.prenorm_gemm_keys(model, 8192)
    assert [(k.hidden_size, k.n_thr, k.tile_n, k.use_block_m, k.block_m) for k in keys] == [
        (h, 1024, 4, False, 1),
        (h, 512, 12, False, 1),
        (h, 512, 12, True, 2),
        (hc * h, 1024, 4, False, 1),
        (hc * h, 512, 12, False, 1),
        (hc * h, 512, 12, True, 2),
    ]
    assert all(k.hc_mult == 1 and k.n_out == 24 and k.n_splits == 1 for k in keys)
    for tokens, index in ((1, 0), (37, 0), (127, 0), (128, 1), (1023, 1), (1024, 2), (8192, 2)):
        for offset, width in ((0, h), (3, hc * h)):
            picked = GEMM.dispatch(num_tokens=tokens, hc_hidden_size=width, hidden_size=width,
                                   hc_mult=1, n_out=24)  # fmt: skip
            assert picked == keys[offset + index], (tokens, width)
    assert vllm_mhc_aot.prenorm_gemm_keys(model, 64) == [keys[0], keys[3]]
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        vllm_mhc_aot.prenorm_gemm_keys(model, 0)


def test_the_gemm_ships_only_for_gpus_without_deepgemm():
    """Ampere builds carry the GEMM's keys after the epilogue's; a Hopper-only build (its
    servers use DeepGEMM) carries the epilogue's alone."""
    model = MhcModelConfig()
    epilogue, gemm = vllm_mhc_aot.VllmMhcPreNormVariant, vllm_mhc_aot.VllmPrenormGemmVariant
    hopper = [epilogue(k, pdl=True) for k in vllm_mhc_aot.warmup_keys(model, 8192, 90)]
    assert vllm_mhc_aot.shipped_variants(model, 8192, (90,)) == hopper
    ampere = [epilogue(k) for k in vllm_mhc_aot.warmup_keys(model, 8192, 80)]
    gemms = [gemm(k) for k in vllm_mhc_aot.prenorm_gemm_keys(model, 8192)]
    for ccs in ((80,), (86,), (80, 86)):
        assert vllm_mhc_aot.shipped_variants(model, 8192, ccs) == ampere + gemms
    # Both: Ampere's without PDL, then Hopper's with it, each once.
    assert vllm_mhc_aot.shipped_variants(model, 8192, (80, 86, 90)) == ampere + hopper + gemms
    assert {v.key for v in ampere} < {v.key for v in hopper}


def test_each_variant_elaborates_pdl_as_its_gpu_does_and_builds_for_it_alone(monkeypatch):
    """From sm_90 vLLM's kernels wait on and trigger programmatic dependent launch, which is
    in their TIR (and so in TileLang's cache key): an sm_90 variant holds both, an Ampere
    variant neither, also on a machine where vLLM enabled PDL at import (a Hopper build
    machine). Each builds only for the GPUs that look it up."""
    from vllm.model_executor.kernels.mhc import tilelang_kernels

    model = MhcModelConfig()
    key = vllm_mhc_aot.warmup_keys(model, 64, 80)[0]
    gemm_key = vllm_mhc_aot.prenorm_gemm_keys(model, 64)[0]
    for variant in (
        vllm_mhc_aot.VllmMhcPreNormVariant(key),
        vllm_mhc_aot.VllmPrenormGemmVariant(gemm_key),
    ):
        with_pdl = dataclasses.replace(variant, pdl=True)
        assert "T.pdl_trigger" not in variant.build().script()
        assert "T.pdl_trigger" in with_pdl.build().script()
        assert with_pdl.label == variant.label[:-1] + ",pdl]"
        assert [cc for cc in (80, 86, 90) if variant.builds_for(cc)] == [80, 86]
        assert [cc for cc in (80, 86, 90) if with_pdl.builds_for(cc)] == [90]
        monkeypatch.setattr(tilelang_kernels, "ENABLE_PDL", True)
        assert "T.pdl_trigger" not in variant.build().script()
        assert tilelang_kernels.ENABLE_PDL is True  # left as it was
        monkeypatch.setattr(tilelang_kernels, "ENABLE_PDL", False)


def test_a_build_compiles_each_variant_only_for_the_gpus_it_builds_for(tmp_path, monkeypatch):
    """``compile_into_cache`` skips a variant on an architecture it does not build for (and
    compiles one without ``builds_for`` everywhere)."""
    built = []

    def fake_fit_report(variant, cc):
        built.append((variant.label, cc))
        return tilelang_build.FitReport(variant.label, f"sm_{cc}", 0, 32, 0, 0), 0.0

    monkeypatch.setattr(tilelang_build, "fit_report", fake_fit_report)
    key = vllm_mhc_aot.warmup_keys(MhcModelConfig(), 64, 80)[0]
    ampere = vllm_mhc_aot.VllmMhcPreNormVariant(key)
    hopper = dataclasses.replace(ampere, pdl=True)
    plain = SimpleNamespace(label="plain")
    _, rows = tilelang_build.compile_into_cache(
        tmp_path, [ampere, hopper, plain], [80, 90], print, "test"
    )
    assert built == [(ampere.label, 80), ("plain", 80), (hopper.label, 90), ("plain", 90)]
    assert [r["arch"] for r in rows] == ["sm_80", "sm_80", "sm_90", "sm_90"]


def test_gemm_tir_does_not_depend_on_the_token_count():
    """The token count is a symbolic dimension: vLLM's stand-ins of 1, 128 or 1,024 tokens
    and any other count give one TIR, so one build serves every batch of its class."""
    import torch
    from vllm.model_executor.warmup.jit_warmup_tilelang_helper import (
        make_tilelang_warmup_tensor as stand_in,
    )

    variant = vllm_mhc_aot.shipped_variants(MhcModelConfig(), 8192)[-2]  # full stream, 512 x 12
    k = variant.key
    width = k.hidden_size * k.hc_mult
    built = variant.build().script()

    def tir_for(tokens: int) -> str:
        fn = stand_in(torch.float32, k.n_out, width)
        x = stand_in(torch.bfloat16, tokens, width)
        out = stand_in(torch.float32, 1, tokens, k.n_out)
        sqrsum = stand_in(torch.float32, 1, tokens)
        kernel = vllm_mhc_aot.server_prenorm_gemm(False)
        return kernel.get_tir(x, fn, out, sqrsum, k.hidden_size, k.hc_mult, k.n_out, k.n_thr,
                              k.tile_n, k.n_splits).script()  # fmt: skip

    assert tir_for(37) == built and tir_for(1000) == built
    assert "num_tokens" in built
    # A different tile does change it (the comparison can fail).
    other = vllm_mhc_aot.shipped_variants(MhcModelConfig(), 8192)[-3]  # 1,024 x 4
    assert other.build().script() != built


def test_variant_reads_its_block_size_from_the_tir():
    variant = vllm_mhc_aot.shipped_variants(MhcModelConfig(), 64)[0]
    assert variant.threads() == 96
    assert variant.label == "vllm.mhc_pre_norm[numel5120,s1,premix0,aux0,fused]"
    small, _, block_m = vllm_mhc_aot.shipped_variants(MhcModelConfig(), 8192)[7:10]
    assert (small.threads(), block_m.threads()) == (1024, 512)
    assert small.label == "vllm.hc_prenorm_gemm[k5120,thr1024,tile4,s1]"
    assert block_m.label == "vllm.hc_prenorm_gemm[k5120,thr512,tile12,block_m2]"


@pytest.mark.aot
@pytest.mark.parametrize("cc, arch, pdl", [(80, "sm_80", False), (90, "sm_90a", True)])
def test_vllms_warmup_loads_the_built_keys_and_compiles_any_other(
    tmp_path, monkeypatch, cc, arch, pdl
):
    """Two keys built for ``sm_{cc}`` on this machine (``aot.build_vllm_mhc``) and seeded:
    vLLM's own ``MHC_PRE_NORM_KERNEL.compile_many`` (its warmup's call, TileLang's parallel
    compile for two or more keys), with TileLang's detector reporting that GPU and vLLM's
    ``ENABLE_PDL`` as that GPU sets it at import, loads both; compiling is made to fail, so
    a miss raises. A key that was not built does reach the compiler."""
    import tilelang.cuda.target as cuda_target
    from tilelang.cache import _dispatch_map
    from tilelang.jit.kernel import JITKernel
    from vllm.model_executor.kernels.mhc import tilelang_kernels
    from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

    model = MhcModelConfig()
    variants = vllm_mhc_aot.shipped_variants(model, 64, (cc,))
    built, not_built = variants[1:3], variants[3]
    monkeypatch.setattr(vllm_mhc_aot, "shipped_variants", lambda *a: built)
    for cache in _dispatch_map.values():
        monkeypatch.setattr(cache, "_memory_cache", {})
    tilelang_build.forget_compiled()
    dest = tmp_path / "vllm_mhc"
    manifest = aot.build_vllm_mhc(dest, [cc], 64, log=print)
    assert [(k["label"], k["error"]) for k in manifest["kernels"]] == [
        (v.label, None) for v in built
    ]

    live = tmp_path / "live"
    assert tilelang_build.seed_tilelang_cache(dest, live) > 0
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(live))
    monkeypatch.setattr(cuda_target, "_detect_torch_cuda_arch", lambda: arch)
    monkeypatch.setattr(cuda_target, "check_cuda_availability", lambda: True)
    monkeypatch.setattr(tilelang_kernels, "ENABLE_PDL", pdl)
    compiled = []

    def no_compile(self, *args, **kwargs):
        compiled.append(self)
        raise AssertionError("compiled instead of loaded from the AOT folder")

    monkeypatch.setattr(JITKernel, "_compile_and_create_adapter", no_compile)
    for cache in _dispatch_map.values():
        monkeypatch.setattr(cache, "_memory_cache", {})
    # The kernel as a CUDA server's vLLM decorates it (see vllm_mhc_aot.server_kernel).
    monkeypatch.setattr(MHC_PRE_NORM_KERNEL, "kernel", vllm_mhc_aot.server_kernel())
    monkeypatch.setattr(MHC_PRE_NORM_KERNEL, "_compiled_cache", {})
    MHC_PRE_NORM_KERNEL.compile_many([v.key for v in built])
    assert set(MHC_PRE_NORM_KERNEL._compiled_cache) == {v.key for v in built}
    assert compiled == []
    with pytest.raises(AssertionError, match="compiled instead of loaded"):
        MHC_PRE_NORM_KERNEL.compile(not_built.key)
    assert dataclasses.asdict(not_built.key)["use_pre_mix_in"] is True


@pytest.mark.aot
def test_vllms_gemm_loads_the_built_keys_at_any_token_count(tmp_path, monkeypatch):
    """Two GEMM keys built for sm_80 and seeded: vLLM's own ``_HC_PRENORM_GEMM_TILELANG_KERNEL``
    (its dispatch and launch arguments, the kernels decorated as on CUDA) loads both with
    compiling made to fail: at its stand-ins' token counts and at 37 and 700 tokens. The
    block_m key, not built, reaches the compiler."""
    import tilelang.cuda.target as cuda_target
    import torch
    from tilelang.cache import _dispatch_map
    from tilelang.jit.kernel import JITKernel
    from vllm.model_executor.kernels.mhc import tilelang_kernels
    from vllm.model_executor.warmup.jit_warmup_tilelang_helper import (
        make_tilelang_warmup_tensor as stand_in,
    )

    gemm = tilelang_kernels._HC_PRENORM_GEMM_TILELANG_KERNEL
    model = MhcModelConfig()
    variants = vllm_mhc_aot.shipped_variants(model, 8192)
    small, default, block_m = variants[-3:]  # the full stream's three classes
    monkeypatch.setattr(vllm_mhc_aot, "shipped_variants", lambda *a: [small, default])
    for cache in _dispatch_map.values():
        monkeypatch.setattr(cache, "_memory_cache", {})
    tilelang_build.forget_compiled()
    dest = tmp_path / "vllm_mhc"
    aot.build_vllm_mhc(dest, [80], 8192, log=print)
    live = tmp_path / "live"
    assert tilelang_build.seed_tilelang_cache(dest, live) > 0
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(live))
    monkeypatch.setattr(cuda_target, "_detect_torch_cuda_arch", lambda: "sm_80")
    monkeypatch.setattr(cuda_target, "check_cuda_availability", lambda: True)

    def no_compile(self, *args, **kwargs):
        raise AssertionError("compiled instead of loaded from the AOT folder")

    monkeypatch.setattr(JITKernel, "_compile_and_create_adapter", no_compile)
    # The kernels as a CUDA server's vLLM decorates them (vllm_mhc_aot.server_prenorm_gemm).
    monkeypatch.setattr(tilelang_kernels, "hc_prenorm_gemm_tilelang",
                        vllm_mhc_aot.server_prenorm_gemm(False))  # fmt: skip
    monkeypatch.setattr(tilelang_kernels, "hc_prenorm_gemm_block_m_tilelang",
                        vllm_mhc_aot.server_prenorm_gemm(True))  # fmt: skip

    def at_tokens(key, tokens: int) -> None:
        """vLLM's launch for a batch of ``tokens`` rows, compiled (never run)."""
        for cache in _dispatch_map.values():
            monkeypatch.setattr(cache, "_memory_cache", {})
        width = key.hidden_size * key.hc_mult
        gemm._warming_key = key
        try:
            gemm(stand_in(torch.bfloat16, tokens, width), stand_in(torch.float32, 24, width),
                 stand_in(torch.float32, 1, tokens, 24), stand_in(torch.float32, 1, tokens),
                 key.hidden_size, key.hc_mult)  # fmt: skip
        finally:
            gemm._warming_key = None

    gemm.compile(small.key)  # vLLM's own stand-ins: 1 token
    gemm.compile(default.key)  # 128 tokens
    at_tokens(small.key, 37)
    at_tokens(default.key, 700)
    with pytest.raises(AssertionError, match="compiled instead of loaded"):
        gemm.compile(block_m.key)


GPU_SCRIPT = r"""
import json, os, sys
from pathlib import Path

import torch
from tilelang.cache import _dispatch_map
from tilelang.jit.kernel import JITKernel
from vllm.model_executor.kernels.mhc import tilelang_kernels
from vllm.model_executor.kernels.mhc.tilelang_kernels import _HC_PRENORM_GEMM_TILELANG_KERNEL
from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

from deepinfer_sm80 import aot, tilelang_build, vllm_mhc_aot
from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig

major, minor = torch.cuda.get_device_capability()
cc = 10 * major + minor
dest, live = Path(sys.argv[1]), Path(sys.argv[2])
variants = [
    v for v in vllm_mhc_aot.shipped_variants(MhcModelConfig(), 8192, (cc,))
    if isinstance(v, vllm_mhc_aot.VllmMhcPreNormVariant)
]
# The broadcast embedding's key and the full stream's with pre-mix and aux, of this GPU's keys.
built = [variants[0], variants[-1]]
# The GEMM's full-stream keys below 128 and below 1,024 tokens (built here also where this
# GPU's servers use DeepGEMM: the GEMM is launched directly below).
gemm_keys = vllm_mhc_aot.prenorm_gemm_keys(MhcModelConfig(), 8192)[3:5]
pdl = cc >= vllm_mhc_aot.PDL_MIN_CC
gemm_built = [vllm_mhc_aot.VllmPrenormGemmVariant(k, pdl=pdl) for k in gemm_keys]
vllm_mhc_aot.shipped_variants = lambda *a: built + gemm_built
aot.build_vllm_mhc(dest, [cc], 8192, log=lambda *a: None)
seeded = tilelang_build.seed_tilelang_cache(dest, live)
os.environ["TILELANG_CACHE_DIR"] = str(live)
for cache in _dispatch_map.values():
    cache._memory_cache = {}
compiled = []
compile_and_create = JITKernel._compile_and_create_adapter


def counting(self, *args, **kwargs):
    compiled.append(1)
    return compile_and_create(self, *args, **kwargs)


JITKernel._compile_and_create_adapter = counting
MHC_PRE_NORM_KERNEL.compile_many([v.key for v in built])  # vLLM's warmup call, its own kernel
loaded = len(compiled)
MHC_PRE_NORM_KERNEL.compile(variants[1].key)  # not built: compiles
# vLLM's own GEMM launched on CUDA tensors at token counts other than its stand-ins'.
before = len(compiled)
width = gemm_keys[0].hidden_size
torch.manual_seed(0)
fn = torch.randn(24, width, device="cuda")
worst = 0.0
for tokens in (37, 700):
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    out = torch.full((1, tokens, 24), float("nan"), device="cuda")
    sqrsum = torch.full((1, tokens), float("nan"), device="cuda")
    _HC_PRENORM_GEMM_TILELANG_KERNEL(x, fn, out, sqrsum, width, 1)
    xf = x.double()
    for got, want in ((out[0], xf @ fn.double().T), (sqrsum[0], (xf * xf).sum(-1))):
        worst = max(worst, ((got.double() - want).abs() / want.abs().clamp_min(1.0)).max().item())
print(json.dumps({
    "cc": cc, "labels": [v.label for v in variants], "seeded": seeded,
    "live_sweep_equal": vllm_mhc_aot.registered_keys(MhcModelConfig(), 8192)
    == vllm_mhc_aot.warmup_keys(MhcModelConfig(), 8192, cc),
    "live_pdl_equal": tilelang_kernels.ENABLE_PDL == pdl,
    "compiled_of_built": loaded, "compiled_of_not_built": len(compiled) - loaded,
    "pass_configs_equal": dict(MHC_PRE_NORM_KERNEL.kernel.pass_configs)
    == vllm_mhc_aot.cuda_pass_configs(),
    "gemm_compiled_at_37_and_700_tokens": len(compiled) - before,
    "gemm_worst_error": worst,
}))
"""


@pytest.mark.gpu
def test_on_a_gpu_vllms_own_kernel_loads_the_build(tmp_path):
    """On a GPU, vLLM's own sweep registers the keys ``warmup_keys`` names for it; vLLM's
    own decorated kernel (not ``server_kernel``'s) and its warmup call
    load two keys built for this GPU and compile a third that was not built; vLLM's own
    pre-norm GEMM, launched at 37 and 700 tokens, loads its two builds (compiles nothing)
    and matches x @ fn^T and the row sums of squares."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = [str(tmp_path / "vllm_mhc"), str(tmp_path / "live")]
    run = subprocess.run([sys.executable, "-c", GPU_SCRIPT, *args], capture_output=True,
                         text=True, env=env, timeout=900, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(result)
    assert result["pass_configs_equal"] and result["seeded"] > 0
    # The keys asked for without a GPU (vllm_mhc_aot.sweep_as_on) are the live sweep's here.
    assert result["live_sweep_equal"], result
    # vLLM enables PDL on this GPU exactly where the variants built for it elaborate it.
    assert result["live_pdl_equal"], result
    assert result["compiled_of_built"] == 0 and result["compiled_of_not_built"] == 1, result
    assert result["gemm_compiled_at_37_and_700_tokens"] == 0, result
    assert result["gemm_worst_error"] < 1e-4, result
