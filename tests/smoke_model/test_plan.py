"""The full preset's tensor inventory, from the metadata-only plan (nothing is allocated)."""

import re

import pytest

from deepinfer_sm80.smoke_model import geometry, plan, tokenizer

VOCAB = tokenizer.ids()["vocab_size"]


@pytest.fixture(scope="module")
def full():
    return {name: (shape, dt) for name, shape, dt in plan.stored_tensors(geometry.FULL, VOCAB)}


def test_names_are_unique_and_shards_cover_the_plan():
    params = plan.params(geometry.FULL, VOCAB)
    names = [n for p in params for n, _, _ in p.stored()]
    assert len(names) == len(set(names))
    groups = plan.shards(params, 2 * 10**9)
    assert [p for g in groups for p in g] == params
    assert all(sum(p.nbytes() for p in g) <= 2 * 10**9 for g in groups)
    assert 3 <= len(groups) <= 5  # about 6.6 GB in all


def test_attention_geometry_is_the_published_one(full):
    assert full["layers.7.attn.wq_a.weight"] == ((1280, 5120), "F8_E4M3")
    assert full["layers.7.attn.wq_a.scale"] == ((40, 160), "F8_E8M0")
    assert full["layers.7.attn.wkv.weight"] == ((512, 5120), "F8_E4M3")
    assert full["layers.7.attn.wq_b.weight"] == ((64 * 512, 1280), "F8_E4M3")
    assert full["layers.7.attn.wq_b.scale"] == ((1024, 40), "F8_E8M0")
    assert full["layers.7.attn.wo_a.weight"] == ((8 * 1024, 64 * 512 // 8), "F8_E4M3")
    assert full["layers.7.attn.wo_b.weight"] == ((5120, 8 * 1024), "F8_E4M3")
    assert full["layers.7.attn.wo_b.scale"] == ((160, 256), "F8_E8M0")
    assert full["layers.7.attn.attn_sink"] == ((64,), "F32")
    assert full["layers.7.attn.q_norm.weight"] == ((1280,), "BF16")
    assert full["layers.7.attn.kv_norm.weight"] == ((512,), "BF16")


def _layers_with(full, suffix):
    found = set()
    for name in full:
        m = re.fullmatch(r"layers\.(\d+)\." + re.escape(suffix), name)
        if m:
            found.add(int(m.group(1)))
    return found


def test_compressors_indexers_and_engram_sit_on_their_source_layers(full):
    assert _layers_with(full, "attn.compressor.wkv.weight") == {2, 8, 14, 20}
    assert _layers_with(full, "attn.compressor.wgate.weight") == {2, 8, 14}  # ratio 2 only
    assert _layers_with(full, "attn.indexer.wq_b.weight") == {2, 8, 14, 20, 24, 28, 32, 36}
    assert _layers_with(full, "attn.indexer.wk.weight") == {2, 8, 14, 20}
    assert _layers_with(full, "engram.embed.weight") == {1, 14}
    assert full["layers.2.attn.indexer.wq_b.weight"] == ((64 * 128, 1280), "F8_E4M3")
    assert full["layers.2.attn.indexer.weights_proj.weight"] == ((64, 5120), "BF16")
    assert full["layers.20.attn.indexer.wk.weight"] == ((128, 512), "BF16")
    assert full["layers.2.attn.compressor.wkv.weight"] == ((512, 5120), "BF16")
    assert not any(n.startswith("mtp.") and (".compressor." in n or ".indexer." in n) for n in full)


def test_moe_formats(full):
    assert full["layers.0.ffn.experts.7.w1.weight"] == ((128, 2560), "I8")
    assert full["layers.0.ffn.experts.7.w1.scale"] == ((128, 160), "F8_E8M0")
    assert full["layers.0.ffn.experts.7.w2.weight"] == ((5120, 64), "I8")
    assert full["layers.0.ffn.experts.7.w2.scale"] == ((5120, 4), "F8_E8M0")
    assert "layers.0.ffn.experts.8.w1.weight" not in full
    assert full["layers.0.ffn.shared_experts.w2.weight"] == ((5120, 128), "F8_E4M3")
    assert full["layers.0.ffn.shared_experts.w2.scale"] == ((160, 4), "F8_E8M0")
    assert full["layers.0.ffn.gate.weight"] == ((8, 5120), "BF16")
    assert full["layers.0.ffn.gate.bias"] == ((8,), "F32")
    assert full["mtp.2.ffn.experts.7.w3.weight"] == ((128, 2560), "I8")


def test_mhc_engram_dspark_and_top_level(full):
    assert full["layers.39.hc_attn_fn"] == ((24, 4 * 5120), "F32")
    assert full["layers.39.hc_ffn_base"] == ((24,), "F32")
    assert full["layers.39.hc_ffn_scale"] == ((3,), "F32")
    rows = geometry.engram_num_embeddings(geometry.FULL)
    assert full["layers.14.engram.embed.weight"] == ((rows[1], 256), "F8_E4M3")
    assert full["layers.14.engram.embed.scale"] == ((rows[1], 8), "F8_E8M0")
    assert full["layers.1.engram.wkv.weight"] == ((5 * 5120, 3 * 8 * 256), "F8_E4M3")
    assert full["mtp.0.main_proj.weight"] == ((5120, 3 * 5120), "F8_E4M3")
    assert full["mtp.2.markov_head.embed.weight"] == ((VOCAB, 256), "BF16")
    assert full["mtp.2.confidence_head.proj.weight"] == ((1, 5120 + 256), "F32")
    assert full["embed.weight"] == ((VOCAB, 5120), "BF16")
    assert full["head.weight"] == ((VOCAB, 5120), "BF16")
    assert {n.split(".")[1] for n in full if n.startswith("mtp.")} == {"0", "1", "2"}
    assert not any(n.startswith(("vision.", "aligner.", "image_", "hc_head")) for n in full)


def test_engram_tables_hold_exactly_their_prime_buckets():
    primes = geometry.engram_primes(geometry.FULL)
    flat = [p for layer in primes for p in layer]
    assert len(flat) == len(set(flat)) == 2 * 3 * 8
    assert min(flat) > geometry.FULL.engram_vocab_size - 1
    assert geometry.engram_num_embeddings(geometry.FULL) == [sum(layer) for layer in primes]


def test_config_carries_the_real_layer_pattern():
    cfg = geometry.hf_config(geometry.FULL, {**tokenizer.ids(), "engram_compressed_vocab_size": 1})
    text = cfg["text_config"]
    assert cfg["model_type"] == "deepseek_v41"
    assert cfg["architectures"] == ["DeepseekV41ForCausalLM"]
    assert text["compress_ratios"] == [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0]
    assert text["index_n_heads"] == 64
    assert text["max_position_embeddings"] == 1048576
    assert text["num_experts_per_tok"] <= text["n_routed_experts"]
    assert text["dspark_noise_token_id"] < text["vocab_size"]
    assert text["engram_pad_token_id"] < text["vocab_size"]
    assert cfg["quantization_config"]["weight_block_size"] == [32, 32]
    assert geometry.with_index_heads(geometry.FULL, 32).index_n_heads == 32
