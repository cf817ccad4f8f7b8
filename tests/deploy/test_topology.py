"""deploy/: topology files, the pipeline-cut rule, refusals and golden launch renders."""

import json
import os
from pathlib import Path

import pytest

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.deploy import cli
from deepinfer_sm80.deploy.config_files import CONFIG_DIR
from deepinfer_sm80.deploy.launcher import render
from deepinfer_sm80.deploy.schema import Topology
from deepinfer_sm80.deploy.topology import ConfigError, load, validate
from tools.tiers import import_or_skip

SHIPPED = ["tp2-pp3", "pp6", "tp2-tp4", "tp4-pp2", "tp8"]


def _validated(name: str):
    """A shipped topology, loaded and validated: what the launcher renders from."""
    return validate(*load(name))


# ------------------------------------------------------------------ the cut rule


def test_legal_cuts_follow_the_sharing_groups():
    assert mt.legal_cut_points() == [1, 2, 8, 14, 20]
    assert (14, 6, 20) in mt.legal_partitions(3) and (14, 14, 12) not in mt.legal_partitions(3)
    assert mt.legal_partitions(2) == [(1, 39), (2, 38), (8, 32), (14, 26), (20, 20)]
    # The last stage always holds 20..39 without the relay, so at most 6 stages exist.
    assert mt.legal_partitions(6) == [(1, 1, 6, 6, 6, 20)] and mt.legal_partitions(7) == []


def test_cut_at_28_needs_the_caches_and_candidate_rows_but_not_topk():
    (item,) = mt.cross_stage([14, 14, 12])
    assert item.cut == 28 and item.group.source == 20
    # Layer 28 is itself an index source: the Top-K rows do not cross (design doc 1.1).
    assert item.objects == ("compressed KV cache", "indexer-K cache", "candidate rows")
    (item,) = mt.cross_stage([20, 6, 14])
    assert "Top-K rows" in item.objects  # 26 reads layer 24's Top-K


def test_relay_capability_unlocks_any_cut():
    relay = mt.PluginCapabilities(relays_shared_kv=True)
    assert mt.partition_errors([14, 14, 12], relay) == []
    assert mt.partition_errors([14, 14, 12])  # refused without it
    assert mt.partition_errors([14, 14, 13], relay) == [
        "the stages hold 41 layers; DeepSeek-V4.1 has 40"
    ]


# ------------------------------------------------------------------ shipped topologies


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_topologies_parse(name):
    topo, path = load(name)
    assert topo.name == name and path.stem == name
    assert topo.max_model_len == 1_048_576 and topo.speculative.num_speculative_tokens == 5
    assert not topo.vision


@pytest.mark.parametrize("name", ["tp2-pp3", "pp6"])
def test_cuts_inside_groups_are_refused_unless_the_relay_is_opted_in(name, monkeypatch):
    monkeypatch.delenv(mt.RELAY_OPT_IN_ENV, raising=False)
    v = validate(*load(name))
    assert not v.launchable
    assert any("splits the sharing group layers 20-39" in e for e in v.errors)
    assert all("start stages only at layers 1, 2, 8, 14, 20" in e for e in v.errors)
    assert all(f"set {mt.RELAY_OPT_IN_ENV}=1 to use it" in e for e in v.errors)
    # Opted in: launchable, with a warning that the relay has not run on GPUs.
    monkeypatch.setenv(mt.RELAY_OPT_IN_ENV, "1")
    v = validate(*load(name))
    assert v.launchable
    (warning,) = [w for w in v.warnings if "pipeline relay" in w]
    assert "has not run on GPUs" in warning and "layer" in warning
    # Once the relay is the plugin's default (proven on GPUs), no opt-in and no warning.
    monkeypatch.delenv(mt.RELAY_OPT_IN_ENV)
    monkeypatch.setattr(mt, "PLUGIN_CAPABILITIES", mt.PluginCapabilities(relays_shared_kv=True))
    v = validate(*load(name))
    assert v.launchable and not [w for w in v.warnings if "pipeline relay" in w]


def test_relay_opt_in_is_refused_inside_the_topology_file(monkeypatch):
    topo, path = load("tp2-pp3")
    monkeypatch.setenv(mt.RELAY_OPT_IN_ENV, "1")
    v = validate(topo.model_copy(update={"env": {mt.RELAY_OPT_IN_ENV: "0"}}), path)
    assert not v.launchable
    assert any(f"env.{mt.RELAY_OPT_IN_ENV}" in e and "not in the topology" in e for e in v.errors)


def test_relay_opt_in_reaches_every_worker_through_the_launch_env(monkeypatch):
    from deepinfer_sm80.deploy import launcher

    monkeypatch.delenv(mt.RELAY_OPT_IN_ENV, raising=False)
    refused = _validated("tp2-pp3")
    with pytest.raises(ValueError, match="splits the sharing group"):
        launcher.render(refused)  # the launcher renders only what validation accepted
    monkeypatch.setenv(mt.RELAY_OPT_IN_ENV, "1")
    plan = launcher.render(_validated("tp2-pp3"))
    assert plan.env[mt.RELAY_OPT_IN_ENV] == "1"
    assert any(d.startswith(f"{mt.RELAY_OPT_IN_ENV}=1") for d, _ in plan.decisions)
    # The launcher follows the capabilities validation used, not the environment at
    # render time.
    monkeypatch.delenv(mt.RELAY_OPT_IN_ENV)
    relayed = validate(*load("tp2-pp3"), mt.PluginCapabilities(relays_shared_kv=True))
    assert launcher.render(relayed).env[mt.RELAY_OPT_IN_ENV] == "1"
    # A topology whose cuts cross nothing does not switch it on, opted in or not.
    assert mt.RELAY_OPT_IN_ENV not in launcher.render(_validated("tp4-pp2")).env
    monkeypatch.setenv(mt.RELAY_OPT_IN_ENV, "1")
    assert mt.RELAY_OPT_IN_ENV not in launcher.render(_validated("tp4-pp2")).env
    assert mt.plugin_capabilities({}).relays_shared_kv is False
    assert mt.plugin_capabilities({mt.RELAY_OPT_IN_ENV: "1"}).relays_shared_kv is True
    assert mt.plugin_capabilities({mt.RELAY_OPT_IN_ENV: "yes"}).relays_shared_kv is False


def test_decode_splits_throughput_is_validated_and_rendered():
    """decode_splits reaches every worker through the launch env (and the config hash),
    whichever it is, so a variable left in a node's environment cannot override it; set
    through env: instead, it is refused."""
    from deepinfer_sm80.deploy import launcher
    from deepinfer_sm80.envs import DECODE_SPLITS_ENV

    tp8, path = load("tp8")
    default = launcher.render(validate(tp8, path))
    assert default.env[DECODE_SPLITS_ENV] == "latency"  # the topology decides
    fast = validate(tp8.model_copy(update={"decode_splits": "throughput"}), path)
    assert not fast.errors
    plan = launcher.render(fast)
    assert plan.env[DECODE_SPLITS_ENV] == "throughput"
    assert any(d == f"{DECODE_SPLITS_ENV}=throughput" for d, _ in plan.decisions)
    assert plan.config_hash() != default.config_hash()
    tp4, path4 = load("tp4-pp2")
    assert not validate(tp4.model_copy(update={"decode_splits": "throughput"}), path4).errors
    errors = validate(
        tp8.model_copy(update={"env": {DECODE_SPLITS_ENV: "throughput"}}), path
    ).errors
    assert any(f"env.{DECODE_SPLITS_ENV}: set decode_splits" in e for e in errors)
    with pytest.raises(ValueError, match="decode_splits"):
        Topology.model_validate({**tp8.model_dump(), "decode_splits": "fast"})


def test_asymmetric_tp_is_plan_only():
    v = validate(*load("tp2-tp4"))
    assert not v.errors and v.plan_only and not v.launchable
    assert "one TP size" in v.plan_only[0]
    assert any("576 is not a multiple of 128" in w for w in v.warnings)


def test_one_tp_size_per_stage_all_equal_launches_as_the_single_size():
    topo, path = load("tp4-pp2")
    listed = topo.model_copy(
        update={"parallel": topo.parallel.model_copy(update={"tensor_parallel": [4, 4]})}
    )
    v = validate(listed, path)
    assert v.launchable, (v.errors, v.plan_only)
    plan = render(v)
    assert plan.argv == render(validate(topo, path)).argv
    assert plan.argv[plan.argv.index("--tensor-parallel-size") + 1] == "4"


GOLDEN_TP4_PP2 = [
    "vllm", "serve", "deepseek-ai/DeepSeek-V4.1-Flash",
    "--served-model-name", "deepseek-v4.1-flash", "--host", "127.0.0.1", "--port", "8000",
    "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
    "--max-model-len", "1048576", "--kv-cache-dtype", "fp8",
    "--gpu-memory-utilization", "0.75", "--max-num-seqs", "16",
    "--max-num-batched-tokens", "8192",
    "--speculative-config",
    '{"method":"dspark","num_speculative_tokens":5,"rejection_sample_method":"block",'
    '"enable_adaptive_verification":false}',
    "--engram-config", '{"cpu_offload":true}',
    "--tokenizer-mode", "deepseek_v41", "--reasoning-parser", "deepseek_v41",
    "--tool-call-parser", "deepseek_v41", "--enable-auto-tool-choice",
    "--language-model-only",
]  # fmt: skip


def test_golden_render_tp4_pp2():
    plan = render(_validated("tp4-pp2"))
    assert plan.argv == GOLDEN_TP4_PP2
    assert plan.env == {
        "VLLM_PP_LAYER_PARTITION": "20,20",
        "DEEPINFER_SPARSE_MLA_DECODE_SPLITS": "latency",
        "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
    }
    assert any("even split" in why for _, why in plan.decisions)


def test_golden_render_tp8():
    plan = render(_validated("tp8"))
    expected = [*GOLDEN_TP4_PP2[:9], "--tensor-parallel-size", "8", "--pipeline-parallel-size", "1"]
    assert plan.argv[:13] == expected
    assert plan.argv[13:] == GOLDEN_TP4_PP2[13:]
    assert "VLLM_PP_LAYER_PARTITION" not in plan.env


def test_adaptive_verification_rendered_off_under_pp(tmp_path):
    data = (CONFIG_DIR / "topologies" / "tp4-pp2.yaml").read_text()
    data = data.replace(
        "num_speculative_tokens: 5}", "num_speculative_tokens: 5, adaptive_verification: true}"
    )
    f = tmp_path / "t.yaml"
    f.write_text(data)
    plan = render(validate(*load(str(f))))
    spec = json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])
    assert spec["enable_adaptive_verification"] is False


# ------------------------------------------------------------------ errors

BASE = "name: t\ngpus: {count: 8}\nparallel: {tensor_parallel: 8}\n"
ERROR_CASES = [
    ("malformed", "name: [unclosed\n", "not valid YAML at line"),
    ("not-a-mapping", "- a\n- b\n", "expected a mapping"),
    ("unknown-key", BASE + "max_model_length: 5\n", "max_model_length: unknown field"),
    ("missing", "name: t\n", "gpus: required field is missing"),
    ("wrong-type", BASE.replace("count: 8", "count: eight"), "gpus.count:"),
    ("out-of-range", BASE + "gpu_memory_utilization: 1.5\n", "gpu_memory_utilization:"),
    ("bad-literal", BASE + "kv_cache_dtype: bf16\n", "kv_cache_dtype:"),
    ("context-absurd", BASE + "max_model_len: 20000000000\n", "max_model_len:"),
    ("bad-port", BASE + "port: 70000\n", "port:"),
    ("bad-spec-method", BASE + "speculative: {method: eagle}\n", "speculative.method:"),
]


@pytest.mark.parametrize("case,text,message", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_load_errors_are_one_clear_message(tmp_path, case, text, message):
    f = tmp_path / f"{case}.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load(str(f))
    assert str(f) in str(info.value)


SEMANTIC_CASES = [
    ("tp-heads", "gpus: {count: 3}\nparallel: {tensor_parallel: 3}\n", "does not divide the 64"),
    ("gpu-count", "gpus: {count: 6}\nparallel: {tensor_parallel: 8}\n", "gpus.count: 6 GPUs"),
    (
        "partition-missing",
        "gpus: {count: 2}\nparallel: {pipeline_parallel: 2}\n",
        "parallel.partition: required with 2 pipeline stages",
    ),
    (
        "partition-count",
        "gpus: {count: 2}\nparallel: {pipeline_parallel: 2, partition: [40]}\n",
        "1 entries for 2 stages",
    ),
    (
        "partition-sum",
        "gpus: {count: 2}\nparallel: {pipeline_parallel: 2, partition: [20, 21]}\n",
        "hold 41 layers",
    ),
    (
        "tp-list-length",
        "gpus: {count: 2}\nparallel: {tensor_parallel: [2], pipeline_parallel: 2,"
        " partition: [20, 20]}\n",
        "1 sizes for 2 stages",
    ),
    (
        "k-too-large",
        "gpus: {count: 8}\nparallel: {tensor_parallel: 8}\n"
        "speculative: {num_speculative_tokens: 7}\n",
        "exceed Ampere shared memory",
    ),
    (
        "partition-without-pp",
        "gpus: {count: 8}\nparallel: {tensor_parallel: 8, partition: [20, 20]}\n",
        "set only with pipeline_parallel > 1",
    ),
]


@pytest.mark.parametrize("case,text,message", SEMANTIC_CASES, ids=[c[0] for c in SEMANTIC_CASES])
def test_validation_errors_name_field_and_fix(tmp_path, case, text, message):
    f = tmp_path / f"{case}.yaml"
    f.write_text("name: t\n" + text)
    v = validate(*load(str(f)))
    assert any(message in e for e in v.errors), v.errors
    assert all(str(f) in e for e in v.errors)


def test_unknown_topology_name_lists_the_shipped_ones():
    shipped = "pp6, smoke, tp2-pp3, tp2-pp3-x2, tp2-tp4, tp4-pp2, tp4-pp2-2nodes, tp8"
    with pytest.raises(ConfigError, match=f"shipped ones: {shipped}"):
        load("tp3")


def test_warnings(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text(
        "name: w\n" + "gpus: {count: 8}\nparallel: {tensor_parallel: 8}\n"
        "gpu_memory_utilization: 0.9\n"
    )
    v = validate(*load(str(f)))
    assert not v.errors and any("first request" in w for w in v.warnings)


# ------------------------------------------------------------------ CLI and schema


def test_cli_dry_run_and_refusal(capsys, monkeypatch):
    monkeypatch.delenv(mt.RELAY_OPT_IN_ENV, raising=False)
    assert cli.main(["launch", "tp8", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "vllm serve deepseek-ai/DeepSeek-V4.1-Flash" in out.out
    assert "decision: --language-model-only" in out.err
    assert cli.main(["launch", "tp2-pp3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "refused before launch" in err and "Traceback" not in err
    assert cli.main(["launch", "nope"]) == 2


def test_launch_runs_each_step_of_the_flow_once(capsys, monkeypatch):
    """load -> validate -> plan -> render, each once, each on the previous step's result:
    the model facts are read once and the plan is not recomputed for the DSpark warning."""
    from deepinfer_sm80.deploy import config_files, launcher, planner, topology

    calls: dict[str, list] = {}

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            result = real(*args, **kwargs)
            calls.setdefault(name, []).append((args, result))
            return result

        monkeypatch.setattr(module, name, wrapper)

    counted(cli, "load")
    counted(cli, "validate")
    counted(cli, "render")
    counted(topology, "plan")
    counted(topology, "model_facts")
    counted(planner, "plan")  # what min_utilization would call without the plan
    counted(planner, "model_facts")  # what plan would read without the facts
    counted(config_files, "model_facts")
    counted(launcher, "_render_nodes")
    monkeypatch.setenv(mt.RELAY_OPT_IN_ENV, "1")
    # tp2-pp3: DSpark above the OOM-prone utilization, so validation also warns with the
    # least utilization that fits, taken from the same plan.
    assert cli.main(["launch", "tp2-pp3", "--dry-run"]) == 0
    assert "this layout needs at least 0.88" in capsys.readouterr().err
    assert {k: len(v) for k, v in calls.items()} == {
        "load": 1, "validate": 1, "render": 1, "plan": 1, "model_facts": 1, "_render_nodes": 1,
    }  # fmt: skip
    (_, (topo, _)), ((v_args, validation),) = calls["load"][0], calls["validate"]
    assert v_args[0] is topo and calls["render"][0][0][0] is validation
    assert validation.plan is calls["plan"][0][1]


def test_launch_without_gpus_stops_at_the_preflight(capsys, monkeypatch):
    """No GPU visible: a clear message and exit 3, and vLLM is never exec'd."""
    from deepinfer_sm80.deploy import doctor

    monkeypatch.setattr(doctor, "_nvidia_smi", lambda: "nvidia-smi not usable (FileNotFoundError)")
    monkeypatch.setattr(cli.os, "execve", lambda *a: pytest.fail("exec'd vLLM without GPUs"))
    assert cli.main(["launch", "tp8"]) == 3
    err = capsys.readouterr().err
    assert "preflight gpus: nvidia-smi not usable" in err
    assert "NVIDIA container toolkit" in err and "nothing was started" in err


def test_launch_preflight_counts_gpus(capsys, monkeypatch):
    from deepinfer_sm80.deploy import doctor

    four = [{"name": "A100", "capability": "8.0", "memory_mib": 81920, "driver": "580.95.05"}] * 4
    monkeypatch.setattr(doctor, "_nvidia_smi", lambda: four)
    monkeypatch.setattr(cli.os, "execve", lambda *a: pytest.fail("exec'd with too few GPUs"))
    assert cli.main(["launch", "tp8"]) == 3
    assert "the topology needs 8" in capsys.readouterr().err


def test_every_schema_field_is_documented_and_the_export_is_current():
    schema = Topology.model_json_schema()
    for defn in [schema, *schema["$defs"].values()]:
        for name, prop in defn["properties"].items():
            assert prop.get("description"), f"field {name} has no docstring"
    exported = json.loads((CONFIG_DIR / "topology.schema.json").read_text())
    assert exported == schema, "run: deepinfer schema > configs/topology.schema.json"


@pytest.mark.vllm
def test_rendered_flags_exist_in_vllm():
    """Every flag we render is an argument of vLLM 0.33.0's `vllm serve`."""
    import dataclasses

    vllm_args = import_or_skip("vllm.engine.arg_utils")
    frontend = import_or_skip("vllm.entrypoints.common.cli_args")
    fields = {f.name for f in dataclasses.fields(vllm_args.AsyncEngineArgs)}
    fields |= {f.name for f in dataclasses.fields(frontend.FrontendArgs)}
    # `--headless` is a `vllm serve` switch added by the CLI, not an engine/frontend field.
    serve_src = Path(frontend.__file__).read_text()
    from deepinfer_sm80.deploy.launcher import NodeSettings

    plans = [render(_validated(name)) for name in ("tp8", "tp4-pp2")]
    plans.append(render(_validated("tp4-pp2-2nodes"), NodeSettings(1, "10.0.0.1", "10.0.0.2")))
    for plan in plans:
        flags = [a[2:].replace("-", "_") for a in plan.argv if a.startswith("--")]
        in_serve = {f for f in flags if f'"--{f.replace("_", "-")}"' in serve_src}
        missing = [f for f in flags if f not in fields and f not in in_serve]
        assert not missing, f"flags vLLM 0.33.0 does not know: {missing}"
    assert Path(vllm_args.__file__).exists()


def test_deploy_imports_neither_torch_nor_vllm():
    """deploy/ must run on any host: importing the CLI pulls in no torch or vLLM."""
    import subprocess
    import sys

    code = (
        "import sys, deepinfer_sm80.deploy.cli; "
        "print(sorted(m for m in ('torch', 'vllm', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_gpus_prints_each_shipped_topologys_gpus_per_node(capsys):
    """`make up` reserves `deepinfer gpus TOPOLOGY` GPUs: the count the schema reads, for
    every shipped file, however the file writes it."""
    for path in sorted((CONFIG_DIR / "topologies").glob("*.yaml")):
        topo, _ = load(str(path))
        assert cli.main(["gpus", path.stem]) == 0
        assert capsys.readouterr().out == f"{topo.gpus.count}\n", path.name
    assert cli.main(["gpus", "tp4-pp2-2nodes"]) == 0
    assert capsys.readouterr().out == "4\n"  # per node, not the whole server


def test_gpus_names_a_bad_topology(tmp_path, capsys):
    assert cli.main(["gpus", "tp3"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "no topology named 'tp3'; shipped ones:" in out.err
    f = tmp_path / "t.yaml"
    f.write_text("name: t\ngpus:\n  count: 0\nparallel: {tensor_parallel: 8}\n")
    assert cli.main(["gpus", str(f)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and f"{f}: gpus.count:" in out.err


def test_listen_host_is_the_container_side_bind_and_leaves_the_topology_alone():
    """In a container vLLM must listen on the container's interface, where docker's
    published port arrives; the topology's host (loopback) still applies elsewhere."""
    from deepinfer_sm80.deploy.launcher import NodeSettings

    tp8 = _validated("tp8")
    plain = render(tp8)
    assert plain.argv[plain.argv.index("--host") + 1] == "127.0.0.1"
    inside = render(tp8, NodeSettings(listen_host="0.0.0.0"))
    assert inside.argv[inside.argv.index("--host") + 1] == "0.0.0.0"
    why = dict(inside.decisions)["--host 0.0.0.0"]
    assert why.endswith("in place of the topology's 127.0.0.1")
    assert [a for a in inside.argv if a != "0.0.0.0"] == [a for a in plain.argv if a != "127.0.0.1"]


def test_cli_listen_host_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("DEEPINFER_LISTEN_HOST", "0.0.0.0")
    monkeypatch.setenv("DEEPINFER_PUBLISHED_HOST", "127.0.0.1")  # as compose.yaml sets it
    assert cli.main(["launch", "tp8", "--dry-run"]) == 0
    assert " --host 0.0.0.0 " in capsys.readouterr().out
    assert cli.main(["launch", "tp8", "--dry-run", "--listen-host", "127.0.0.1"]) == 0
    assert " --host 127.0.0.1 " in capsys.readouterr().out


def test_launch_check_runs_everything_but_starts_nothing(capsys, monkeypatch):
    monkeypatch.setattr(cli, "preflight", lambda topo: [])
    monkeypatch.setattr(cli.shutil, "which", lambda name: "/opt/venv/bin/vllm")
    monkeypatch.setattr(cli.os, "execve", lambda *a: pytest.fail("--check exec'd vLLM"))
    monkeypatch.setattr(cli, "_write_runtime_file", lambda *a: pytest.fail("--check wrote"))
    assert cli.main(["launch", "tp8", "--check"]) == 0
    assert "checked: the launch would start vllm serve" in capsys.readouterr().err
    monkeypatch.delenv(mt.RELAY_OPT_IN_ENV, raising=False)
    assert cli.main(["launch", "tp2-pp3", "--check"]) == 2
    assert "refused before launch" in capsys.readouterr().err
    from deepinfer_sm80.deploy import doctor

    monkeypatch.setattr(cli, "preflight", lambda topo: [doctor.Check("gpus", False, "none")])
    assert cli.main(["launch", "tp8", "--check"]) == 3


def test_make_smoke_writes_serves_and_checks_the_smoke_checkpoint(tmp_path):
    """`make smoke` (dry run): the checkpoint is written once in the container, the smoke
    topology is brought up on its one GPU, and the host checks readiness without
    expecting a known answer from random weights."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    # A checkout whose host-side deepinfer is this Python's (a dry run builds none, and
    # its `make up` asks `deepinfer gpus` for the count).
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("Makefile", "configs", "requirements", "overlay"):
        (checkout / name).symlink_to(root / name)
    exe = checkout / ".venv-cli" / "bin" / "deepinfer"
    exe.parent.mkdir(parents=True)
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{root / "overlay"}" exec "{sys.executable}" '
                   '-m deepinfer_sm80.deploy.cli "$@"\n')  # fmt: skip
    exe.chmod(0o755)
    drop = ("TOPOLOGY", "GPU_COUNT", "MAKEFLAGS", "MAKELEVEL")
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "smoke"],
        cwd=checkout, capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k not in drop},
    ).stdout  # fmt: skip
    assert "TOPOLOGY=smoke GPU_COUNT=1 docker compose run --rm --no-deps" in out
    assert "GPU_COUNT=1 docker compose up -d" in out  # the sub-make's count, from the file
    assert "deepinfer smoke-model /home/deepinfer/.cache/huggingface/deepinfer-smoke-v41" in out
    topo, _ = load("smoke")
    assert topo.model == "/home/deepinfer/.cache/huggingface/deepinfer-smoke-v41"
    assert "up TOPOLOGY=smoke" in out
    assert "health --ready --no-known-answer --service deepinfer" in out
    assert f"--served-model-name {topo.served_model_name}" in out
