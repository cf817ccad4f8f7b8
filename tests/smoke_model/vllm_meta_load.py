"""Build vLLM 0.33.0's DeepSeek-V4.1 model and DSpark draft on the meta device and run
their real ``load_weights`` over the smoke checkpoint's tensors (as meta tensors of the
planned shapes and dtypes). Prints one JSON line: parameters, loaded, missing, extra.
Given a written tiny-preset folder as argument, it also builds the target model on the
CPU, loads that folder through vLLM's safetensors iterator and reports whether the
loaded parameters hold the checkpoint's bytes (``values``).

This machine has no GPU driver and vLLM's CUDA extensions are absent, so the process
reports an H200 (capability 9.0) to vLLM and stubs the extension modules: model
construction then takes vLLM's CUDA code path (its V4.1 quant config, MXFP8 linears,
MXFP4 experts) without launching anything. Run as a script; it patches torch.cuda for
the whole process.
"""

import contextlib
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import torch


class _AnyModule(types.ModuleType):
    __path__ = ()  # importable as a package

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


class _AnyOps:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: False


class _Stream:
    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a, **k):
        pass


class _Props:
    multi_processor_count = 132
    total_memory = 140 << 30
    name = "NVIDIA H200"
    major, minor = 9, 0
    L2_cache_size = 60 << 20
    warp_size = 32


def _pretend_h200() -> None:
    for mod in (
        "vllm._C_stable_libtorch",
        "vllm._C",
        "vllm._moe_C",
        "vllm.cumem_allocator",
        "vllm.vllm_flash_attn",
        "vllm.vllm_flash_attn.flash_attn_interface",
        "vllm._flashmla_C",
        "vllm._flashmla_extension_C",
    ):
        sys.modules[mod] = _AnyModule(mod)
    for ns in ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar", "_flashmla_C"):
        setattr(torch.ops, ns, _AnyOps())
    register_fake = torch.library.register_fake

    def tolerant_register_fake(op, func=None, *a, **k):
        def deco(f):
            with contextlib.suppress(RuntimeError):  # the op's library is a stub above
                register_fake(op, f, *a, **k)
            return f

        return deco(func) if func is not None else deco

    torch.library.register_fake = tolerant_register_fake
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Stream
    torch.cuda.get_device_properties = lambda *a, **k: _Props()
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.accelerator.current_device_index = lambda: 0

    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    def _cap(capability):
        return capability[0] * 10 + capability[1] if isinstance(capability, tuple) else capability

    class H200(CudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(9, 0)

        @classmethod
        def has_device_capability(cls, capability, device_id=0):
            return _cap(capability) <= 90

        @classmethod
        def is_device_capability(cls, capability, device_id=0):
            return _cap(capability) == 90

        @classmethod
        def get_device_name(cls, device_id=0):
            return "NVIDIA H200"

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return 140 << 30

    platforms._current_platform = H200()


def main() -> None:
    from deepinfer_sm80.smoke_model import geometry, plan, tokenizer

    directory = Path(tempfile.mkdtemp(prefix="smoke-config-"))
    vocab = tokenizer.write(directory)
    g = geometry.FULL
    (directory / "config.json").write_text(json.dumps(geometry.hf_config(g, vocab)))
    dtypes = {
        "F8_E4M3": torch.float8_e4m3fn,
        "F8_E8M0": torch.float8_e8m0fnu,
        "I8": torch.int8,
        "BF16": torch.bfloat16,
        "F32": torch.float32,
    }
    stored = plan.stored_tensors(g, vocab["vocab_size"])

    def checkpoint():
        for name, shape, dt in stored:
            yield name, torch.empty(shape, dtype=dtypes[dt], device="meta")

    _pretend_h200()
    report = {}
    _init_distributed()
    report.update(_meta_load(directory, checkpoint))
    if len(sys.argv) > 1:
        report["values"] = _tiny_values(Path(sys.argv[1]))
    print(json.dumps(report))


def _init_distributed() -> None:
    from vllm.distributed import init_distributed_environment

    port = 29500 + os.getpid() % 1000
    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
        backend="gloo",
    )


def _engine_config(directory: Path, **extra):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(directory),
        load_format="dummy",
        language_model_only=True,
        max_model_len=4096,
        enforce_eager=True,
        engram_config={"cpu_offload": False},
        **extra,
    ).create_engine_config()


def _meta_load(directory: Path, checkpoint) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import initialize_model_parallel
    from vllm.utils.torch_utils import set_default_torch_dtype

    cfg = _engine_config(
        directory, speculative_config={"method": "dspark", "num_speculative_tokens": 5}
    )
    report = {"quant_config": type(cfg.quant_config).__module__}
    with set_current_vllm_config(cfg):
        initialize_model_parallel(1, 1)
        from vllm.models.deepseek_v41.nvidia.dspark import DSparkDeepseekV4ForCausalLM
        from vllm.models.deepseek_v41.nvidia.vl_model import DeepseekV41ForCausalLM

        for label, cls in (
            ("target", DeepseekV41ForCausalLM),
            ("draft", DSparkDeepseekV4ForCausalLM),
        ):
            with set_default_torch_dtype(torch.bfloat16), torch.device("meta"):
                model = cls(vllm_config=cfg, prefix="")
            params = {n for n, _ in model.named_parameters()}
            loaded = set(model.load_weights(checkpoint()))
            report[label] = {
                "params": len(params),
                "loaded": len(loaded),
                "missing": sorted(params - loaded),
                "extra": sorted(loaded - params),
            }
    return report


def _tiny_values(directory: Path) -> dict:
    """Loaded parameter bytes against the checkpoint bytes, per loader path."""
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import initialize_model_parallel, model_parallel_is_initialized
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm.utils.torch_utils import set_default_torch_dtype

    cfg = _engine_config(directory)
    with set_current_vllm_config(cfg):
        if not model_parallel_is_initialized():  # the meta pass set the groups up
            initialize_model_parallel(1, 1)
        from vllm.models.deepseek_v41.nvidia.vl_model import DeepseekV41ForCausalLM

        with set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
            model = DeepseekV41ForCausalLM(vllm_config=cfg, prefix="")
        files = sorted(str(f) for f in directory.glob("*.safetensors"))
        model.load_weights(safetensors_weights_iterator(files, False))
    p = {k: v.detach() for k, v in model.named_parameters()}
    t = {}
    for f in files:
        t.update(load_file(f))

    def u(x):
        return x.view(torch.uint8)

    def rows(scale):  # one [32, 32]-block scale row per 32 weight rows
        return u(scale).repeat_interleave(32, 0)

    m = "language_model.model.layers."
    experts = m + "4.ffn.experts.routed_experts."
    e = "layers.4.ffn.experts.1."
    checks = {
        "mxfp4 w13 codes": (
            u(p[experts + "w13_weight"][1]),
            torch.cat([u(t[e + "w1.weight"]), u(t[e + "w3.weight"])]),
        ),
        "mxfp4 w13 scales": (
            p[experts + "w13_weight_scale"][1],
            torch.cat([u(t[e + "w1.scale"]), u(t[e + "w3.scale"])]),
        ),
        "mxfp4 w2 codes": (u(p[experts + "w2_weight"][1]), u(t[e + "w2.weight"])),
        "mxfp8 merged codes": (
            u(p[m + "2.attn.fused_wqa_wkv.weight"]),
            torch.cat([u(t["layers.2.attn.wq_a.weight"]), u(t["layers.2.attn.wkv.weight"])]),
        ),
        "mxfp8 merged scales": (
            p[m + "2.attn.fused_wqa_wkv.weight_scale"],
            torch.cat([rows(t["layers.2.attn.wq_a.scale"]), rows(t["layers.2.attn.wkv.scale"])]),
        ),
        "mxfp8 row-parallel scales": (
            p[m + "0.ffn.shared_experts.down_proj.weight_scale"],
            rows(t["layers.0.ffn.shared_experts.w2.scale"]),
        ),
        "engram table": (
            u(p[m + "1.engram.embed_tokens.weight"]),
            u(t["layers.1.engram.embed.weight"]),
        ),
        "engram scales": (
            p[m + "1.engram.embed_tokens.weight_scale_inv"],
            u(t["layers.1.engram.embed.scale"]),
        ),
        "attention sink": (p[m + "3.attn.attn_sink"][:4], t["layers.3.attn.attn_sink"]),
        "mhc fn": (p[m + "3.hc_ffn_fn"], t["layers.3.hc_ffn_fn"]),
        "gate bias": (p[m + "3.ffn.gate.e_score_correction_bias"], t["layers.3.ffn.gate.bias"]),
        "compressor": (
            p[m + "2.attn.compressor.fused_wkv_wgate.weight"],
            torch.cat(
                [
                    t["layers.2.attn.compressor.wkv.weight"],
                    t["layers.2.attn.compressor.wgate.weight"],
                ]
            ),
        ),
        "lm head": (p["language_model.lm_head.weight"], t["head.weight"]),
    }
    return {name: bool(torch.equal(a, b)) for name, (a, b) in checks.items()}


if __name__ == "__main__":
    main()
