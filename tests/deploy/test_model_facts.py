"""configs/model/deepseek-v4.1-flash.yaml agrees with the code that uses the facts."""

import yaml

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.deploy import schema, topology
from deepinfer_sm80.deploy.config_files import CONFIG_DIR
from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES
from deepinfer_sm80.ops.topk_swa.ref import combined_width


def test_model_facts_match_the_code():
    facts = yaml.safe_load((CONFIG_DIR / "model" / "deepseek-v4.1-flash.yaml").read_text())
    assert facts["num_hidden_layers"] == mt.NUM_LAYERS
    assert tuple(facts["kv_source_layer_ids"]) == mt.KV_SOURCES
    assert tuple(facts["index_source_layer_ids"]) == mt.INDEX_SOURCES
    assert facts["candidate_source_layer_id"] == mt.CANDIDATE_SOURCE
    assert facts["num_attention_heads"] == mt.NUM_ATTENTION_HEADS == schema.MAX_HEADS
    assert facts["hidden_size"] == mt.HIDDEN_SIZE
    assert facts["hc_mult"] == mt.HC_MULT
    assert facts["head_dim"] == mt.HEAD_DIM
    assert facts["moe"]["moe_intermediate_size"] == mt.MOE_INTERMEDIATE_SIZE
    assert tuple(facts["engram_layer_ids"]) == mt.ENGRAM_LAYERS
    assert facts["num_hidden_layers"] == schema.MAX_LAYERS
    ratios = {}
    for span, ratio in facts["compress_ratios"].items():
        first, last = map(int, span.split("-"))
        ratios.update(dict.fromkeys(range(first, last + 1), ratio))
    assert tuple(ratios[i] for i in range(mt.NUM_LAYERS)) == mt.COMPRESS_RATIOS
    assert facts["dspark_block_size"] == topology.MAX_SPEC_TOKENS_AMPERE
    assert facts["kv_bytes_per_token"]["v4_record"] == RECORD_BYTES
    assert combined_width(facts["index_topk"], facts["sliding_window"]) == 640
    # Every layer from a group's source to the next source reads that source.
    sources = [g.source for g in mt.SHARING_GROUPS]
    assert sources == facts["kv_source_layer_ids"]


def test_model_constants_match_the_smoke_checkpoints_geometry():
    """The smoke checkpoint keeps the real model's shapes outside the MoE sizes."""
    from deepinfer_sm80.smoke_model import geometry

    g = geometry.FULL
    assert g.num_hidden_layers == mt.NUM_LAYERS
    assert g.num_attention_heads == mt.NUM_ATTENTION_HEADS
    assert g.hidden_size == mt.HIDDEN_SIZE and g.hc_mult == mt.HC_MULT
    assert g.head_dim == mt.HEAD_DIM
    assert g.engram_layer_ids == mt.ENGRAM_LAYERS
    assert g.compress_ratios[: mt.NUM_LAYERS] == mt.COMPRESS_RATIOS
    assert g.kv_source_layer_ids == mt.KV_SOURCES
    assert g.index_source_layer_ids == mt.INDEX_SOURCES


def test_smoke_facts_match_the_smoke_checkpoint():
    from deepinfer_sm80.smoke_model import geometry, tokenizer

    smoke = yaml.safe_load((CONFIG_DIR / "model" / "deepseek-v4.1-smoke.yaml").read_text())
    g = geometry.FULL
    assert smoke["moe"] == {
        "n_routed_experts": g.n_routed_experts,
        "num_experts_per_tok": g.num_experts_per_tok,
        "moe_intermediate_size": g.moe_intermediate_size,
    }
    assert smoke["dspark_moe"] == {
        "n_routed_experts": g.dspark_n_routed_experts,
        "num_experts_per_tok": g.dspark_num_experts_per_tok,
    }
    assert smoke["vocab_size"] == tokenizer.ids()["vocab_size"]
