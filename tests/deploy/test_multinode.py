"""Multi-node and replicated topologies: node layout rules, per-node rendering (golden),
the config hash that makes node mismatches visible, health of headless nodes."""

import json
import os
from pathlib import Path

import pytest

from deepinfer_sm80.deploy import cli, doctor, health, nodes, planner
from deepinfer_sm80.deploy.launcher import NodeSettings, render
from deepinfer_sm80.deploy.topology import load, validate

GOLDEN = Path(__file__).parent / "golden"


def _topo(name):
    return load(name)[0]


def _validated(name):
    return validate(*load(name))


def _golden(name: str, plan) -> None:
    path = GOLDEN / f"{name}.json"
    got = {"argv": plan.argv, "env": plan.env, "config_hash": plan.config_hash()}
    if os.environ.get("DEEPINFER_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert path.exists(), f"{path} missing: run with DEEPINFER_UPDATE_GOLDEN=1 and review"
    assert got == json.loads(path.read_text()), f"{name}: rendering changed; review the diff"


@pytest.mark.parametrize("rank", [0, 1])
def test_tp4_pp2_2nodes_renders_each_node(rank):
    node = NodeSettings(rank=rank, master_addr="10.0.0.1", host_ip=f"10.0.0.{rank + 1}")
    plan = render(_validated("tp4-pp2-2nodes"), node)
    _golden(f"tp4-pp2-2nodes.node{rank}", plan)
    argv = plan.argv
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--node-rank") + 1] == str(rank)
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.1"
    assert ("--headless" in argv) == (rank > 0)
    assert plan.env["VLLM_HOST_IP"] == f"10.0.0.{rank + 1}"
    assert plan.env["VLLM_PP_LAYER_PARTITION"] == "20,20"


def test_config_hash_equal_across_nodes_and_sensitive_to_real_differences():
    topo, path = load("tp4-pp2-2nodes")
    v = validate(topo, path)
    h0 = render(v, NodeSettings(0, "10.0.0.1", "10.0.0.1")).config_hash()
    h1 = render(v, NodeSettings(1, "10.0.0.1", "10.0.0.2")).config_hash()
    assert h0 == h1
    other_master = render(v, NodeSettings(1, "10.0.0.9")).config_hash()
    assert other_master != h0
    changed = validate(topo.model_copy(update={"max_num_seqs": 8}), path)
    assert render(changed, NodeSettings(1, "10.0.0.1")).config_hash() != h0
    assert doctor.check_config_hash(h0, h1 + "\n").ok
    bad = doctor.check_config_hash(h0, "0" * 16)
    assert not bad.ok and "identical on every node" in bad.fix


def test_launch_refuses_a_node_whose_hash_differs(capsys, monkeypatch):
    monkeypatch.setenv("DEEPINFER_EXPECT_CONFIG_HASH", "0123456789abcdef")
    rc = cli.main(["launch", "tp4-pp2-2nodes", "--dry-run", "--node-rank", "1",
                   "--master-addr", "10.0.0.1"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "differs from DEEPINFER_EXPECT_CONFIG_HASH" in err


def test_launch_needs_master_addr_and_a_valid_rank(capsys):
    assert cli.main(["launch", "tp4-pp2-2nodes", "--dry-run", "--master-addr", ""]) == 2
    assert "MASTER_ADDR" in capsys.readouterr().err
    rc = cli.main(["launch", "tp4-pp2-2nodes", "--dry-run", "--node-rank", "2",
                   "--master-addr", "10.0.0.1"])  # fmt: skip
    assert rc == 2 and "must be 0..1" in capsys.readouterr().err
    assert cli.main(["launch", "tp8", "--dry-run", "--node-rank", "1"]) == 2
    assert "runs on one node" in capsys.readouterr().err


def test_stage_placement_and_engram_host_ram():
    topo = _topo("tp4-pp2-2nodes")
    assert nodes.stage_nodes(topo) == [[0, 0, 0, 0], [1, 1, 1, 1]]
    ram = nodes.engram_host_gib(topo, 94.5)
    assert ram == [pytest.approx(189.0), 0.0]  # layers 1 and 14 are both on node 0
    p = planner.plan(topo)
    assert [n["stages"] for n in p.nodes] == [[0], [1]]
    assert p.nodes[0]["host_ram_gib"] > 200 > p.nodes[1]["host_ram_gib"]
    assert "node 1: 4 GPUs, stages 1" in planner.format_plan(p)


def _variant(tmp_path, body: str):
    f = tmp_path / "t.yaml"
    f.write_text("name: t\n" + body)
    return validate(*load(str(f)))


def test_layouts_that_cannot_be_served_are_refused(tmp_path):
    base = "speculative: {method: none}\ngpu_memory_utilization: 0.8\n"
    # TP4 over 6-GPU nodes: stage 1's TP group straddles the node boundary.
    v = _variant(tmp_path, "gpus: {count: 6}\nnodes: {count: 2}\n"
                 "parallel: {tensor_parallel: 4, pipeline_parallel: 3, partition: [8, 12, 20]}\n"
                 + base)  # fmt: skip
    assert any("straddles two nodes" in e for e in v.errors), v.errors
    # GPU count that does not match the layout.
    v = _variant(tmp_path, "gpus: {count: 6}\nnodes: {count: 2}\n"
                 "parallel: {tensor_parallel: 4, pipeline_parallel: 2, partition: [20, 20]}\n"
                 + base)  # fmt: skip
    assert any("needs 8" in e for e in v.errors), v.errors
    # Replicas and multi-node together.
    v = _variant(tmp_path, "gpus: {count: 4}\nnodes: {count: 2}\nreplicas: 2\n"
                 "parallel: {tensor_parallel: 4, pipeline_parallel: 2, partition: [20, 20]}\n"
                 + base)  # fmt: skip
    assert any("replica spans one node" in e for e in v.errors), v.errors
    # TP across nodes is allowed, with a warning about the network.
    v = _variant(tmp_path, "gpus: {count: 4, kind: A100-80GB}\nnodes: {count: 2}\n"
                 "parallel: {tensor_parallel: 8}\n" + base)  # fmt: skip
    assert not v.errors, v.errors
    assert any("spans nodes" in w for w in v.warnings)


def test_replicas_topology_is_refused_like_its_layout_until_the_relay():
    topo, path = load("tp2-pp3-x2")
    v = validate(topo, path)
    assert topo.replicas == 2
    assert any("sharing group" in e for e in v.errors)


def test_worker_health_finds_vllm_processes(tmp_path):
    for pid, argv in ((11, [b"/opt/venv/bin/python", b"/opt/venv/bin/vllm", b"serve", b"m"]),
                      (12, [b"bash"]), (13, [b"python", b"-m", b"pytest"])):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    (tmp_path / "self").mkdir()
    assert health.check_worker(str(tmp_path)) == [11]
    (tmp_path / "11" / "cmdline").write_bytes(b"bash\0")
    with pytest.raises(health.HealthError, match="no `vllm serve`"):
        health.check_worker(str(tmp_path))


def test_config_hash_ignores_the_listen_address():
    """Only node 0 serves HTTP; a worker whose env file binds elsewhere (or not at all)
    still runs the same server."""
    v = _validated("tp4-pp2-2nodes")
    h0 = render(v, NodeSettings(0, "10.0.0.1", listen_host="0.0.0.0")).config_hash()
    h1 = render(v, NodeSettings(1, "10.0.0.1")).config_hash()
    assert h0 == h1
