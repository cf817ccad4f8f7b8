"""configs/model/deepseek-v4.1-flash.yaml agrees with the code that uses the facts."""

import yaml

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.deploy import topology
from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES
from deepinfer_sm80.ops.topk_swa.ref import combined_width


def test_model_facts_match_the_code():
    facts = yaml.safe_load((topology.CONFIG_DIR / "model" / "deepseek-v4.1-flash.yaml").read_text())
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
