"""deepinfer_sm80.vllm_mhc_aot: vLLM's own mHC pre-norm kernel, built ahead of time for the
keys its JIT warmup compiles, is what vLLM's warmup loads on a server of that architecture."""

import dataclasses
import json

import pytest

from deepinfer_sm80 import aot, tilelang_build, vllm_mhc_aot
from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig


def test_pass_configs_are_vllms_on_a_cuda_platform(monkeypatch):
    """Off CUDA vLLM leaves its register-usage level out; a CUDA server's key holds it."""
    import vllm.tilelang_utils as tilelang_utils

    monkeypatch.setattr(tilelang_utils.current_platform, "is_cuda", lambda: True)
    assert tilelang_utils._get_pass_configs.__wrapped__() == vllm_mhc_aot.cuda_pass_configs()


def test_keys_are_what_an_ampere_server_registers():
    """Without DeepGEMM (Ampere; this machine) the warmup compiles split 1 for the broadcast
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


def test_variant_reads_its_block_size_from_the_tir():
    variant = vllm_mhc_aot.shipped_variants(MhcModelConfig(), 64)[0]
    assert variant.threads() == 96
    assert variant.label == "vllm.mhc_pre_norm[numel5120,s1,premix0,aux0,fused]"


@pytest.mark.aot
def test_vllms_warmup_loads_the_built_keys_and_compiles_any_other(tmp_path, monkeypatch):
    """Two keys built for sm_80 (``aot.build_vllm_mhc``) and seeded: vLLM's own
    ``MHC_PRE_NORM_KERNEL.compile_many`` (its warmup's call, TileLang's parallel compile for
    two or more keys) with TileLang's detector reporting sm_80 loads both; compiling is made
    to fail, so a miss raises. A key that was not built does reach the compiler."""
    import tilelang.cuda.target as cuda_target
    from tilelang.cache import _dispatch_map
    from tilelang.jit.kernel import JITKernel
    from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

    model = MhcModelConfig()
    variants = vllm_mhc_aot.shipped_variants(model, 64)
    built, not_built = variants[1:3], variants[3]
    monkeypatch.setattr(vllm_mhc_aot, "shipped_variants", lambda *a: built)
    for cache in _dispatch_map.values():
        monkeypatch.setattr(cache, "_memory_cache", {})
    tilelang_build.forget_compiled()
    dest = tmp_path / "vllm_mhc"
    manifest = aot.build_vllm_mhc(dest, [80], 64, log=print)
    assert [(k["label"], k["error"]) for k in manifest["kernels"]] == [
        (v.label, None) for v in built
    ]

    live = tmp_path / "live"
    assert tilelang_build.seed_tilelang_cache(dest, live) > 0
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(live))
    monkeypatch.setattr(cuda_target, "_detect_torch_cuda_arch", lambda: "sm_80")
    monkeypatch.setattr(cuda_target, "check_cuda_availability", lambda: True)
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


GPU_SCRIPT = r"""
import json, os, sys
from pathlib import Path

import torch
from tilelang.cache import _dispatch_map
from tilelang.jit.kernel import JITKernel
from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

from deepinfer_sm80 import aot, tilelang_build, vllm_mhc_aot
from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig

major, minor = torch.cuda.get_device_capability()
cc = 10 * major + minor
dest, live = Path(sys.argv[1]), Path(sys.argv[2])
variants = vllm_mhc_aot.shipped_variants(MhcModelConfig(), 8192)
# The broadcast embedding's key and the full stream's with pre-mix and aux, of this GPU's keys.
built = [variants[0], variants[-1]]
vllm_mhc_aot.shipped_variants = lambda *a: built
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
print(json.dumps({
    "cc": cc, "labels": [v.label for v in variants], "seeded": seeded,
    "compiled_of_built": loaded, "compiled_of_not_built": len(compiled) - loaded,
    "pass_configs_equal": dict(MHC_PRE_NORM_KERNEL.kernel.pass_configs)
    == vllm_mhc_aot.cuda_pass_configs(),
}))
"""


@pytest.mark.gpu
def test_on_a_gpu_vllms_own_kernel_loads_the_build(tmp_path):
    """On a GPU, vLLM's own decorated kernel (not ``server_kernel``'s) and its warmup call
    load two keys built for this GPU and compile a third that was not built."""
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
    assert result["compiled_of_built"] == 0 and result["compiled_of_not_built"] == 1, result
