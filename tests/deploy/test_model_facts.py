"""configs/model/deepseek-v4.1-flash.yaml agrees with the code that uses the facts."""

import yaml

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.deploy import topology
from deepinfer_sm80.deploy.config_files import CONFIG_DIR
from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES
from deepinfer_sm80.ops.topk_swa.ref import combined_width


def test_model_facts_match_the_code():
    facts = yaml.safe_load((CONFIG_DIR / "model" / "deepseek-v4.1-flash.yaml").read_text())
    assert facts["num_hidden_layers"] == mt.NUM_LAYERS
    assert tuple(facts["kv_source_layer_ids"]) == mt.KV_SOURCES
    assert tuple(facts["index_source_layer_ids"]) == mt.INDEX_SOURCES
    assert facts["candidate_source_layer_id"] == mt.CANDIDATE_SOURCE
    assert facts["num_attention_heads"] == topology.NUM_HEADS
    assert facts["moe"]["moe_intermediate_size"] == topology.MOE_INTERMEDIATE
    assert facts["dspark_block_size"] == topology.MAX_SPEC_TOKENS_AMPERE
    assert facts["kv_bytes_per_token"]["v4_record"] == RECORD_BYTES
    assert combined_width(facts["index_topk"], facts["sliding_window"]) == 640
    # Every layer from a group's source to the next source reads that source.
    sources = [g.source for g in mt.SHARING_GROUPS]
    assert sources == facts["kv_source_layer_ids"]


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
