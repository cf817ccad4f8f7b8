"""deepinfer plan: per-stage weights, KV bytes per token, the tightest-stage pool."""

import json
from pathlib import Path

import pytest

from deepinfer_sm80.deploy import cli, planner
from deepinfer_sm80.deploy.config_files import model_facts
from deepinfer_sm80.deploy.topology import load, validate

GIB = 2**30


def test_layer_weights_follow_the_shapes_and_the_checkpoint_size():
    f = model_facts()
    expert = 3 * 5120 * 2304
    want = 384 * expert * 0.53125 + expert * 1.03125 + f["attention_params_per_layer"] * 1.03125
    assert planner.layer_weight_bytes(f) == pytest.approx(want)
    backbone = 40 * planner.layer_weight_bytes(f) / GIB
    # Within 5% of the third-party 284 GiB backbone figure (embeddings, DSpark aside).
    assert abs(backbone - 284) / 284 < 0.05


def test_kv_bytes_per_token_per_stage():
    f = model_facts()
    both = planner.kv_bytes_per_token(f, range(0, 40), set())
    assert both == pytest.approx(3 * (584 + 132) / 2 + (584 + 132))  # ~1.75 KiB/token
    stages = planner.plan(load("tp2-pp3")[0]).stages
    # 0-13 holds L2 and L8 (ratio 2); 14-27 holds L14 and L20; 28-39 mirrors L20.
    assert [s.kv_bytes_per_token for s in stages] == [716, 1074, 716]


def test_pool_is_the_tightest_stage_and_compares_with_the_original():
    p = planner.plan(load("tp2-pp3")[0])
    assert p.kv_tokens == min(s.kv_tokens for s in p.stages) > 1_048_576
    assert any("4,648,480" in n for n in p.notes)
    tp8 = planner.plan(load("tp8")[0])
    (s,) = tp8.stages
    assert s.kv_tokens == int(s.kv_budget_gib * GIB // s.kv_bytes_per_token)


def test_more_memory_more_tokens_and_unknown_gpu():
    topo = load("tp8")[0]
    assert planner.plan(topo, "A100-40GB").kv_tokens < planner.plan(topo, "A100-80GB").kv_tokens
    with pytest.raises(ValueError, match="--gpu: unknown GPU 'H100'"):
        planner.plan(topo, "H100")


def test_a_topology_that_does_not_fit_is_refused_with_numbers(tmp_path):
    f = tmp_path / "small.yaml"
    f.write_text("name: small\ngpus: {count: 8, kind: A100-40GB}\nparallel: {tensor_parallel: 8}\n")
    v = validate(*load(str(f)))
    (err,) = v.errors
    assert "does not fit 8 x A100-40GB" in err and "GiB of weights" in err
    assert "raise gpu_memory_utilization" in err


def test_cli_plan_all_ranks(capsys):
    assert cli.main(["plan", "--all", "--gpu", "A100-80GB"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    tokens = [int(line.split(":")[1].split("KV")[0].replace(",", "")) for line in lines]
    assert tokens == sorted(tokens, reverse=True)
    assert len(lines) == len(planner.shipped_topologies())
    assert any("tp4-pp2-2nodes" in line and "on 2 nodes" in line for line in lines)
    assert any("tp2-pp3-x2" in line and "x 2 replicas" in line for line in lines)
    assert cli.main(["plan", "tp8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["topology"] == "tp8" and data["fits"] and data["stages"][0]["tensor_parallel"] == 8


def test_component_breakdown_adds_up():
    f = model_facts()
    parts = planner.component_bytes(f)
    layers = sum(v for k, v in parts.items() if "all layers" in k)
    assert layers == pytest.approx(40 * planner.layer_weight_bytes(f))
    p = planner.plan(load("tp8")[0])
    assert p.components_gib["embedding (BF16)"] == pytest.approx(129280 * 5120 * 2 / GIB)
    assert "weights by component" in planner.format_plan(p)


def test_min_utilization_is_where_the_context_starts_to_fit():
    topo = load("tp2-pp3")[0]
    need = planner.min_utilization(topo)
    assert planner.min_utilization(topo, p=planner.plan(topo)) == need
    assert 0.78 < need < topo.gpu_memory_utilization
    below = topo.model_copy(update={"gpu_memory_utilization": need - 0.005})
    above = topo.model_copy(update={"gpu_memory_utilization": need + 0.005})
    assert not planner.plan(below).fits and planner.plan(above).fits


def test_oom_warning_and_shipped_utilization_tell_the_same_story(monkeypatch):
    """The shipped 64 GB layouts need more than the DSpark-safe 0.78 to fit: the warning
    says both bounds instead of advising a value at which nothing fits."""
    monkeypatch.setenv("DEEPINFER_PP_RELAY", "1")
    v = validate(*load("tp2-pp3"))
    (warning,) = [w for w in v.warnings if "first request" in w]
    assert "needs at least 0.88 to hold max_model_len 1,048,576" in warning
    assert "both cannot hold" in warning and "speculative.method: none" in warning
    tp8 = load("tp8")[0].model_copy(update={"gpu_memory_utilization": 0.9})
    (warning,) = [w for w in validate(tp8, Path("tp8.yaml")).warnings if "first request" in w]
    assert "this layout fits from 0.56: use 0.78 or less" in warning


def test_gap_to_the_original_is_explained_term_by_term():
    p = planner.plan(load("tp2-pp3")[0])
    (note,) = [n for n in p.notes if "4,648,480" in n]
    assert "(ratio 0.786)" in note and "4.65 GiB of KV against 3.66 GiB here" in note
    assert "0.99 GiB apart" in note and "3 GiB for CUDA graphs" in note


def test_planner_reports_the_relay_bytes_per_cut():
    """Per pipeline cut, the bytes per token the layer-source relay sends across it
    (model_topology.relay_bytes_per_token), as the plan reports them."""
    p = planner.plan(load("tp2-pp3")[0])
    assert p.relay_bytes_per_token == {14: 0, 28: 8908}
    assert "layer 28: 40,976 B + relay 8,908 B" in planner.format_plan(p)
    assert planner.plan(load("pp6")[0]).relay_bytes_per_token[21] == 584 + 132 + 8192 + 2048
    assert planner.plan(load("tp8")[0]).relay_bytes_per_token == {}


def test_smoke_facts_overlay_the_real_ones():
    full, smoke = model_facts(), model_facts("smoke")
    assert smoke["moe"]["moe_intermediate_size"] == 128 != full["moe"]["moe_intermediate_size"]
    assert smoke["num_hidden_layers"] == full["num_hidden_layers"]
    with pytest.raises(ValueError, match="neither full nor smoke"):
        model_facts("tiny")


def test_validation_carries_the_plan_it_checked():
    """validate plans once and keeps the plan; it is the plan `deepinfer plan` prints."""
    topo, path = load("tp8")
    v = validate(topo, path)
    assert v.plan == planner.plan(topo)
    assert v.plan.fits and v.launchable
    # A layout error stops before planning: no plan to carry.
    bad = validate(topo.model_copy(update={"gpus": topo.gpus.model_copy(update={"count": 6})}),
                   path)  # fmt: skip
    assert bad.errors and bad.plan is None
