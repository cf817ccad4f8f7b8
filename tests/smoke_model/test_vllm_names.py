"""Checkpoint names through vLLM 0.33.0's own name mapping, onto the parameters its
DeepSeek-V4.1 modules register.

The renaming steps are vLLM's functions (the VL wrapper's ``WeightsMapper``, the
routed-expert mapping, the DSpark draft's ``_remap_dspark_name``); the two
``load_weights`` loops around them are restated here in a few lines. The expected
parameter inventory is written out from the module definitions (attention.py,
compressor.py, engram.py, nvidia/model.py, nvidia/dspark.py and the MXFP8 / MXFP4
quantization methods), so a name the loader would not find fails here.
"""

import re
import types

import pytest
import torch

from deepinfer_sm80.smoke_model import geometry, plan, tokenizer

pytestmark = pytest.mark.vllm

G = geometry.FULL
VOCAB = tokenizer.ids()["vocab_size"]
STACKED = [
    ("gate_up_proj", "w1"),
    ("gate_up_proj", "w3"),
    ("attn.fused_wqa_wkv", "attn.wq_a"),
    ("attn.fused_wqa_wkv", "attn.wkv"),
    ("compressor.fused_wkv_wgate", "compressor.wkv"),
    ("compressor.fused_wkv_wgate", "compressor.wgate"),
]


@pytest.fixture(scope="module")
def vllm_parts():
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.models.deepseek_v41.nvidia import dspark
    from vllm.models.deepseek_v41.nvidia.vl_model import _make_deepseek_v4_vl_weights_mapper

    # the linear scale name vLLM picks for [32, 32] blocks with fp4 experts
    mapper = _make_deepseek_v4_vl_weights_mapper("fp4", "weight_scale")
    return types.SimpleNamespace(
        mapper=mapper,
        experts=RoutedExperts.build_expert_params_mapping,
        dspark=dspark,
    )


def _decoder_params(p: str, layer: int, engram: bool) -> set[str]:
    q = {"weight", "weight_scale"}
    names = set()
    for lin in ("fused_wqa_wkv", "wq_b", "wo_a", "wo_b"):
        names |= {f"{p}.attn.{lin}.{s}" for s in q}
    names |= {f"{p}.attn.q_norm.weight", f"{p}.attn.kv_norm.weight", f"{p}.attn.attn_sink"}
    if G.is_kv_source(layer):
        names |= {f"{p}.attn.compressor.fused_wkv_wgate.weight", f"{p}.attn.compressor.norm.weight"}
    if G.is_index_source(layer):
        names |= {f"{p}.attn.indexer.wq_b.{s}" for s in q}
        names |= {f"{p}.attn.indexer.weights_proj.weight"}
        if G.is_kv_source(layer):
            names |= {f"{p}.attn.indexer.wk.weight", f"{p}.attn.indexer.k_norm.weight"}
    names |= {f"{p}.ffn.gate.{s}" for s in ("weight", "e_score_correction_bias", "bias_vl")}
    names |= {f"{p}.ffn.shared_experts.{m}.{s}" for m in ("gate_up_proj", "down_proj") for s in q}
    names |= {f"{p}.ffn.experts.routed_experts.{w}_{s}" for w in ("w13", "w2") for s in q}
    names |= {f"{p}.attn_norm.weight", f"{p}.ffn_norm.weight"}
    names |= {f"{p}.hc_{a}_{b}" for a in ("attn", "ffn") for b in ("fn", "base", "scale")}
    if engram:
        names |= {f"{p}.engram.embed_tokens.{s}" for s in ("weight", "weight_scale_inv")}
        names |= {f"{p}.engram.wkv.{s}" for s in q} | {
            f"{p}.engram.q_weight",
            f"{p}.engram.k_weight",
        }
    return names


def _target_expected() -> set[str]:
    m = "language_model.model"
    names = {f"{m}.embed_tokens.weight", f"{m}.norm.weight", "language_model.lm_head.weight"}
    for i in range(G.num_hidden_layers):
        names |= _decoder_params(f"{m}.layers.{i}", i, i in G.engram_layer_ids)
    return names


def _draft_expected() -> set[str]:
    names = {
        "model.main_proj.weight",
        "model.main_proj.weight_scale",
        "model.main_norm.weight",
        "model.norm.weight",
        "model.markov_head.markov_w1.weight",
        "model.markov_head.markov_w2.weight",
        "model.confidence_head.proj.weight",
    }
    for k in range(G.dspark_layers):
        names |= _decoder_params(f"model.layers.{k}", G.num_hidden_layers + k, False)
    return names


def _stored_names():
    return [n for n, _, _ in plan.stored_tensors(G, VOCAB)]


def _target_load(vllm_parts, names):
    """VL mapper, then DeepseekV4Model.load_weights' renames (nvidia/model.py)."""
    experts = vllm_parts.experts("w1", "w2", "w3", G.n_routed_experts)
    mapped = [n for n, _ in vllm_parts.mapper.apply((n, torch.empty(0)) for n in names)]
    loaded = []
    for name in mapped:
        if not name.startswith("language_model.model."):
            loaded.append(name)  # lm_head: loaded by AutoWeightsLoader directly
            continue
        assert not name.split(".", 2)[2].startswith(("vision.", "aligner.", "image_"))
        for param, weight in STACKED:
            if ".experts." in name or weight not in name:
                continue
            loaded.append(name.replace(weight, param))
            break
        else:
            if ".experts." in name:
                hits = [name.replace(w, p) for p, w, _, _ in experts if w in name]
                assert len(hits) >= 1, name
                loaded.append(hits[0])
            else:
                loaded.append(name)
    return mapped, loaded


def test_every_target_name_lands_on_a_vllm_parameter(vllm_parts):
    names = _stored_names()
    mapped, loaded = _target_load(vllm_parts, names)
    # the VL wrapper drops the DSpark draft weights; everything else reaches the LLM
    assert len(mapped) == len([n for n in names if not n.startswith("mtp.")])
    assert all(n.startswith("language_model.") for n in mapped)
    expected = _target_expected()
    assert set(loaded) - expected == set()
    assert expected - set(loaded) == set()


def test_every_draft_name_lands_on_a_dspark_parameter(vllm_parts):
    fake = types.SimpleNamespace(model=types.SimpleNamespace(confidence_head=object()))
    remap = vllm_parts.dspark.DSparkDeepseekV4ForCausalLM._remap_dspark_name
    experts = vllm_parts.experts("w1", "w2", "w3", G.dspark_n_routed_experts)
    loaded = set()
    for name in _stored_names():
        name = remap(fake, name)
        if name is None:
            continue
        if name.endswith(".scale"):
            # MXFP4 experts and MXFP8 linears both register ``weight_scale`` here
            name = name.removesuffix(".scale") + ".weight_scale"
        name = name.replace(".shared_experts.w2", ".shared_experts.down_proj")
        if ".experts." in name:
            hits = [name.replace(w, p) for p, w, _, _ in experts if w in name]
            assert hits, name
            loaded.add(hits[0])
            continue
        if name.startswith("model.layers."):
            for param, weight in STACKED[:4]:
                if weight in name:
                    name = name.replace(weight, param)
                    break
        name = re.sub(r"\.ffn\.gate\.bias$", ".ffn.gate.e_score_correction_bias", name)
        loaded.add(name)
    expected = _draft_expected()
    assert loaded - expected == set()
    assert expected - loaded == set()


def test_vllm_reads_the_config_and_tokenizer_as_written(tmp_path):
    import json

    from vllm.models.deepseek_v41.common.engram import EngramLayout, build_compressed_token_map
    from vllm.tokenizers.deepseek_v41 import DeepseekV41Tokenizer
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    vocab = tokenizer.write(tmp_path)
    cfg = DeepseekV41Config(**geometry.hf_config(G, vocab))
    assert cfg.expert_dtype == "fp4"
    assert cfg.rope_parameters["rope_type"] == "yarn"
    assert cfg.vision_n_layers == 32 and cfg.hidden_size == 5120 and cfg.index_n_heads == 64
    layout = EngramLayout(cfg)
    assert [sum(p for per_ngram in layer for p in per_ngram) for layer in layout.primes] == list(
        cfg.engram_num_embeddings
    )
    tok = DeepseekV41Tokenizer.from_pretrained(str(tmp_path))
    assert build_compressed_token_map(tok)[1] == cfg.engram_compressed_vocab_size
    assert len(tok) == cfg.vocab_size
    prompt = tok.apply_chat_template([{"role": "user", "content": "héllo"}], tokenize=False)
    ids = tok.apply_chat_template([{"role": "user", "content": "héllo"}])
    assert ids[0] == cfg.bos_token_id and tok.decode(ids) == prompt
    assert (
        json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == tokenizer.EOS
    )


def test_vllm_load_weights_consumes_the_full_checkpoint(tmp_path):
    """vLLM's own model classes, built on the meta device, load every planned tensor;
    on the CPU, a written tiny checkpoint arrives in the parameters byte for byte."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from deepinfer_sm80.smoke_model import writer

    script = Path(__file__).with_name("vllm_meta_load.py")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    writer.write(tmp_path, geometry.TINY, seed=5, log=lambda _: None)
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["quant_config"] == "vllm.models.deepseek_v41.quant_config"
    # the vision tower's learned delimiters: a placeholder under --language-model-only
    assert report["target"]["missing"] == ["image_end", "image_newline", "image_start"]
    assert report["target"]["extra"] == []
    assert report["target"]["loaded"] == report["target"]["params"] - 3
    # embed/lm_head are aliased from the target model, not loaded by the draft
    assert report["draft"]["missing"] == ["lm_head.weight", "model.embed_tokens.weight"]
    assert report["draft"]["extra"] == []
    assert len(report["values"]) == 13
    assert [k for k, same in report["values"].items() if not same] == []


def test_vllm_dequantizes_the_written_codes_as_the_generator_does():
    """vLLM's reference MXFP8 / MXFP4 decoders read the codes and scales the same way."""
    from vllm.model_executor.layers.fused_moe.flashinfer_moe_ep import (
        _dequant_mxfp4_ue8m0_gran32,
    )
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import dequant_mxfp8_to_bf16

    from deepinfer_sm80.smoke_model import quant

    g = torch.Generator().manual_seed(11)
    w = torch.randn(96, 256, generator=g) / 16
    codes, scale = quant.quantize_fp8(w)
    # vLLM's loader repeats each [32, 32]-block scale row over its 32 weight rows
    per_row = scale.view(torch.uint8).repeat_interleave(32, 0)
    ours = quant.dequantize_fp8(codes, scale).bfloat16()
    assert torch.equal(dequant_mxfp8_to_bf16(codes, per_row), ours)
    packed, scale4 = quant.quantize_fp4(w)
    ours4 = quant.dequantize_fp4(packed, scale4).bfloat16()
    assert torch.equal(_dequant_mxfp4_ue8m0_gran32(packed, scale4), ours4)
