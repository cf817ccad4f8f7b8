"""`deepinfer` against hostile and careless input: every case ends in the CLI's error code
with one message that names the field (or file) and the fix, without a traceback, in well
under a second. Cases are generated per field and per kind of abuse.

Each runs ``cli.main`` in-process (an escaping exception is what would print a
traceback) under an alarm, so a hang fails the case instead of the suite.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.deploy import cli, config_files, doctor

LIMIT_S = 2.0
_REAL_SMI = doctor._nvidia_smi
BASE = {"name": "t", "gpus": {"count": 8}, "parallel": {"tensor_parallel": 8}}


@contextlib.contextmanager
def _deadline(seconds: float):
    def expire(*_):
        raise TimeoutError(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _run_cli(argv, capsys) -> tuple[int, str]:
    start = time.monotonic()
    try:
        with _deadline(LIMIT_S * 2):
            code = cli.main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    except Exception as exc:  # noqa: BLE001 -- any escape is what a user sees as a traceback
        pytest.fail(f"{type(exc).__name__} escaped the CLI: {str(exc)[:200]}", pytrace=False)
    took = time.monotonic() - start
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    assert took < LIMIT_S, f"took {took:.1f} s"
    return code, text


def _with(path: str, value) -> dict:
    """BASE with the dotted field set to value."""
    data = yaml.safe_load(yaml.safe_dump(BASE))
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return data


# ------------------------------------------------------------------ generated field cases

NUMERIC_FIELDS = {
    "gpus.count": [0, -1, 10**12, "abc", 2.5, None],
    "parallel.tensor_parallel": [0, -8, 3, 128, 10**12, "eight", 2.5, None, []],
    "parallel.pipeline_parallel": [0, -1, 41, 10**9, "two", 1.5],
    "parallel.partition": [[0, 40], [-1, 41], [20, "x"], "20,20", [1] * 41],
    "nodes.count": [0, -2, 10**6, "many"],
    "nodes.master_port": [0, -1, 65536, "port"],
    "replicas": [0, -1, 10**6, "x"],
    "max_model_len": [0, -1, 2_000_000, 10**12, "1M", 1.5],
    "gpu_memory_utilization": [0, -0.5, 1.5, 0.99, "high", float("nan"), float("inf")],
    "max_num_seqs": [0, -1, 10**9, "x"],
    "max_num_batched_tokens": [0, -1, 10**9, "x"],
    "speculative.num_speculative_tokens": [0, -1, 7, 10**6, "k"],
    "port": [0, -1, 65536, "http"],
}
STRING_FIELDS = {
    "name": ["", "a b", "x; rm -rf /", "$(reboot)", "a" * 100, 5],
    "host": ["", "0.0.0.0; rm -rf /", "a b", "-h", "$(id)"],
    "served_model_name": ["", "a b", "x\ny", "$(id)"],
    "model": ["", "   ", "a\nb", "x" * 2000],
    "description": ["two\nlines", "x" * 600],
    "gpus.kind": ["H100", "", "A100 80GB SXM5 Hopper", 80, ["A100-80GB"]],
    "kv_cache_dtype": ["bf16", ""],
    "decode_splits": ["fast"],
    "speculative.method": ["eagle"],
    "nodes.backend": ["slurm"],
    "env": [["A=1"], "A=1"],
    "extra_vllm_args": ["--foo", {"a": 1}],
}
# Why some fields' messages carry a different field name: the semantic rule they break.
MESSAGE_FIELD = {
    ("parallel.tensor_parallel", "3"): "does not divide the 64 attention heads",
    ("parallel.tensor_parallel", "128"): "parallel.tensor_parallel",
    ("max_model_len", "2000000"): "max_position_embeddings",
    ("speculative.num_speculative_tokens", "7"): "speculative.num_speculative_tokens",
    ("parallel.pipeline_parallel", "41"): "parallel.pipeline_parallel",
}

FIELD_CASES = [
    pytest.param(field, value, id=f"{field}={value!r}"[:60])
    for table in (NUMERIC_FIELDS, STRING_FIELDS)
    for field, values in table.items()
    for value in values
]


@pytest.mark.parametrize(("field", "value"), FIELD_CASES)
def test_bad_field_value_is_refused_naming_the_field(tmp_path, capsys, field, value):
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump(_with(field, value)))
    code, text = _run_cli(["validate", str(f)], capsys)
    assert code == 2, text
    expected = MESSAGE_FIELD.get((field, repr(value)), field)
    assert f"error: {f}" in text and expected in text, text


# ------------------------------------------------------------------ env and extra args

ENV_KEYS = ["A=B", "1X", "", "A B", "$(reboot)", "X;Y", "é", "A-B", "K" * 200]
OVERRIDING_ENV = [
    ("VLLM_PP_LAYER_PARTITION", "21,19", "parallel.partition"),
    ("VLLM_API_KEY", "k", "a secret"),
    ("VLLM_HOST_IP", "10.0.0.9", "VLLM_HOST_IP in the node's .env"),
    ("VLLM_ENGINE_READY_TIMEOUT_S", "1", "the launcher"),
    (mt.RELAY_OPT_IN_ENV, "1", "not in the topology file"),
    ("DEEPINFER_SPARSE_MLA_DECODE_SPLITS", "throughput", "set decode_splits"),
]
OVERRIDING_ARGS = [
    (["--pipeline-parallel-size", "3"], "--pipeline-parallel-size"),
    (["--tensor-parallel-size=3"], "--tensor-parallel-size"),
    (["-tp", "3"], "-tp"),
    (["-pp=2"], "-pp"),
    (["--max_model_len", "4194304"], "--max-model-len"),
    (["--max-model", "4194304"], "--max-model-len"),
    (["--speculative-config", '{"num_speculative_tokens": 8}'], "--speculative-config"),
    (["--host", "0.0.0.0"], "--host"),
    (["--host=0.0.0.0"], "--host"),
    (["--port", "1"], "--port"),
    (["--gpu-memory-utilization", "0.99"], "--gpu-memory-utilization"),
    (["--kv-cache-dtype", "auto"], "--kv-cache-dtype"),
    (["--api-key", "secret"], "--api-key"),
    (["--config", "other.yaml"], "--config"),
    (["--served-model-name", "x"], "--served-model-name"),
    (["--nnodes", "4"], "--nnodes"),
    (["--engram-config", "{}"], "--engram-config"),
    (["--max-num-seqs", "4096"], "--max-num-seqs"),
]


@pytest.mark.parametrize("key", ENV_KEYS, ids=[repr(k)[:20] for k in ENV_KEYS])
def test_env_keys_must_be_variable_names(tmp_path, capsys, key):
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump({**BASE, "env": {key: "1"}}))
    code, text = _run_cli(["launch", str(f), "--dry-run"], capsys)
    assert code == 2 and f"error: {f}: env: " in text and "variable name" in text, text


@pytest.mark.parametrize(
    ("key", "value", "why"), OVERRIDING_ENV, ids=[e[0] for e in OVERRIDING_ENV]
)
def test_env_cannot_override_a_validated_setting(tmp_path, capsys, monkeypatch, key, value, why):
    monkeypatch.delenv(mt.RELAY_OPT_IN_ENV, raising=False)
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump({**BASE, "env": {key: value}}))
    code, text = _run_cli(["launch", str(f), "--dry-run"], capsys)
    assert code == 2 and f"env.{key}" in text and why in text, text
    assert "vllm serve" not in text


@pytest.mark.parametrize(("args", "flag"), OVERRIDING_ARGS, ids=[a[0][0] for a in OVERRIDING_ARGS])
def test_extra_args_cannot_override_a_validated_setting(tmp_path, capsys, args, flag):
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump({**BASE, "extra_vllm_args": args}))
    code, text = _run_cli(["launch", str(f), "--dry-run"], capsys)
    assert code == 2 and "extra_vllm_args[0]" in text and f"overrides {flag}," in text, text
    assert "vllm serve" not in text


def test_harmless_extra_args_and_env_still_pass(tmp_path, capsys):
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump({**BASE, "extra_vllm_args": ["--max-log-len", "100"],
                                 "env": {"NCCL_DEBUG": "WARN"}}))  # fmt: skip
    code, text = _run_cli(["launch", str(f), "--dry-run"], capsys)
    assert code == 0 and "--max-log-len 100" in text and "NCCL_DEBUG=WARN" in text


def test_dry_run_is_safe_to_paste_into_a_shell(tmp_path, capsys):
    """Whatever the values hold, the printed line splits back into exactly the rendered
    environment and argv: nothing in it runs."""
    nasty = "$(touch pwned) `id` ; rm -rf / && echo 'q' \"dq\" \\ end"
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump({**BASE, "env": {"NCCL_DEBUG": nasty},
                                 "extra_vllm_args": ["--max-log-len", nasty]}))  # fmt: skip
    code, _ = _run_cli(["launch", str(f), "--dry-run"], capsys)
    assert code == 0
    cli.main(["launch", str(f), "--dry-run"])
    line = capsys.readouterr().out.strip()
    words = shlex.split(line)
    assert f"NCCL_DEBUG={nasty}" in words and words[-1] == nasty
    out = subprocess.run(["sh", "-c", f"env() {{ :; }}; set -- {line}; echo $#"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=10)  # fmt: skip
    assert not (tmp_path / "pwned").exists(), out
    assert int(out.stdout) == len(words)


# ------------------------------------------------------------------ the file itself

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
YAML_CASES = [
    ("alias-bomb", ALIAS_BOMB, "aliases (*name) are not accepted"),
    ("merge-key", "x: &x {count: 8}\nname: t\ngpus: {<<: *x}\n", "aliases (*name)"),
    ("deep-flow", "name: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 16"),
    ("deep-block", "".join("  " * i + f"k{i}:\n" for i in range(40)) + "  " * 40 + "v\n",
     "nested deeper than 16"),
    ("duplicate-top", "name: t\nname: u\ngpus: {count: 8}\n", "key 'name' appears twice"),
    ("duplicate-nested", "name: t\ngpus: {count: 8, count: 6}\n", "key 'count' appears twice"),
    ("duplicate-tp", "name: t\ngpus: {count: 8}\nparallel: {tensor_parallel: 8}\n"
     "parallel: {tensor_parallel: 3}\n", "key 'parallel' appears twice"),
    ("python-tag", "name: !!python/object:os.system ls\n", "not valid YAML"),
    ("empty", "", "expected a mapping"),
    ("scalar", "tp8\n", "expected a mapping"),
    ("list", "- name: t\n", "expected a mapping"),
    ("unclosed", "name: [t\n", "not valid YAML at line"),
    ("tab-indent", "name: t\ngpus:\n\tcount: 8\n", "not valid YAML"),
    ("complex-key", "? [a, b]\n: 1\nname: t\n", "a mapping key must be a plain name"),
    ("int-key", "1: 2\nname: t\ngpus: {count: 8}\n", ": 1: Keys should be strings"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "text", "message"), YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_hostile_yaml_is_refused_fast(tmp_path, capsys, case, text, message):
    f = tmp_path / f"{case}.yaml"
    f.write_text(text)
    code, out = _run_cli(["validate", str(f)], capsys)
    assert code == 2 and str(f) in out and message in out, out


def test_non_utf8_file_is_named_with_the_place(tmp_path, capsys):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("name: t\ndescription: caf\xe9\n".encode("latin-1"))
    code, out = _run_cli(["validate", str(f)], capsys)
    assert code == 2 and f"{f}: not UTF-8 text (byte 0xe9 at line 2); save it as UTF-8" in out


def test_huge_file_is_refused_before_reading(tmp_path, capsys):
    f = tmp_path / "big.yaml"
    with f.open("wb") as fh:
        fh.truncate(50 * 2**20)  # sparse: 50 MB that takes no time to make
    code, out = _run_cli(["validate", str(f)], capsys)
    assert code == 2 and "52,428,800 bytes, more than the 262,144" in out


@pytest.mark.parametrize("command", [["validate"], ["launch", "--dry-run"], ["plan"]])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/null", "dir", "missing.yaml"])
def test_special_files_are_refused(tmp_path, capsys, command, special):
    if special == "fifo":
        target = tmp_path / "t.yaml"
        os.mkfifo(target)
    elif special == "dir":
        target = tmp_path / "d.yaml"
        target.mkdir()
    elif special == "missing.yaml":
        target = tmp_path / special
    else:
        target = Path(special)
    code, out = _run_cli([command[0], str(target), *command[1:]], capsys)
    assert code == 2 and f"error: {target}: " in out, out
    assert any(w in out for w in ("not a regular file", "a directory", "cannot read")), out


# ------------------------------------------------------------------ model facts

FACTS_CASES = [
    ("missing-key", lambda f: f.pop("max_position_embeddings"), "max_position_embeddings"),
    ("negative", lambda f: f.__setitem__("num_hidden_layers", -40), "num_hidden_layers"),
    ("string", lambda f: f.__setitem__("num_attention_heads", "64"), "num_attention_heads"),
    ("nested", lambda f: f["moe"].pop("moe_intermediate_size"), "moe.moe_intermediate_size"),
    ("not-a-mapping", lambda f: f.__setitem__("kv_bytes_per_token", 584),
     "kv_bytes_per_token.v4_record"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "edit", "key"), FACTS_CASES, ids=[c[0] for c in FACTS_CASES])
def test_malformed_model_facts_are_named(tmp_path, capsys, monkeypatch, case, edit, key):
    facts = yaml.safe_load(config_files.MODEL_FACTS_FILE.read_text())
    edit(facts)
    f = tmp_path / "facts.yaml"
    f.write_text(yaml.safe_dump(facts))
    monkeypatch.setattr(config_files, "MODEL_FACTS_FILE", f)
    for argv in (["validate", "tp8"], ["plan", "tp8"]):
        code, out = _run_cli(argv, capsys)
        assert code == 2 and f"error: {f}: {key}: expected a positive number" in out, out


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"a: [1\n", b"- 1\n"], ids=["binary", "bad", "list"])
def test_unreadable_model_facts_are_named(tmp_path, capsys, monkeypatch, raw):
    f = tmp_path / "facts.yaml"
    f.write_bytes(raw)
    monkeypatch.setattr(config_files, "MODEL_FACTS_FILE", f)
    code, out = _run_cli(["validate", "tp8"], capsys)
    assert code == 2 and str(f) in out, out


# ------------------------------------------------------------------ GPUs and partitions


@pytest.mark.parametrize(
    ("smi", "kind"),
    [("A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
     ("NVIDIA A100 80GB PCIe", "A100-80GB"), ("NVIDIA RTX A6000", "A6000"),
     ("NVIDIA GeForce RTX 3090", "RTX3090"), ("NVIDIA A800-SXM4-80GB", "A800-80GB")],
)  # fmt: skip
def test_nvidia_smi_gpu_names_are_accepted(tmp_path, capsys, smi, kind):
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump(_with("gpus.kind", smi)))
    code, out = _run_cli(["plan", str(f), "--json"], capsys)
    assert f'"gpu": "{kind}"' in out, out
    assert code in (0, 1)  # fits or not; either way a plan


@pytest.mark.parametrize("stages", [8, 14, 40])
def test_partition_suggestion_is_instant_with_the_relay(tmp_path, capsys, monkeypatch, stages):
    monkeypatch.setenv(mt.RELAY_OPT_IN_ENV, "1")
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump({"name": "t", "gpus": {"count": stages},
                                 "parallel": {"pipeline_parallel": stages}}))  # fmt: skip
    code, out = _run_cli(["validate", str(f)], capsys)
    best = mt.most_even_partition(stages, mt.PluginCapabilities(relays_shared_kv=True))
    assert code == 2 and f"required with {stages} pipeline stages" in out
    assert f"e.g. {list(best)}" in out and max(best) == -(-40 // stages)


# ------------------------------------------------------------------ doctor

SMI_OUTPUTS = [
    ("na-memory", "NVIDIA A100-SXM4-80GB, 8.0, [N/A], 580.95.05", "memory unknown"),
    ("na-everything", "[N/A], [N/A], [N/A], [N/A]", "[FAIL] ampere"),
    ("short-line", "NVIDIA A100", "unexpected line"),
    ("inf-memory", "NVIDIA A100, 8.0, inf, 580.95.05", "memory unknown"),
]


@pytest.mark.parametrize(
    ("case", "stdout", "message"), SMI_OUTPUTS, ids=[c[0] for c in SMI_OUTPUTS]
)
def test_doctor_survives_odd_nvidia_smi_output(capsys, monkeypatch, case, stdout, message):
    def fake(*a, **k):
        return subprocess.CompletedProcess(a, 0, stdout=stdout + "\n", stderr="")

    monkeypatch.setattr(doctor, "_nvidia_smi", lambda: _REAL_SMI(fake))
    code, out = _run_cli(["doctor"], capsys)
    assert code == 1 and message in out, out


def test_doctor_does_not_wait_on_a_hung_nvidia_smi(capsys, monkeypatch):
    def hung(*a, timeout, **k):
        assert timeout <= 10
        raise subprocess.TimeoutExpired(a, timeout)

    monkeypatch.setattr(doctor, "_nvidia_smi", lambda: _REAL_SMI(hung))
    code, out = _run_cli(["doctor"], capsys)
    assert code == 1 and "nvidia-smi did not answer within 10 s" in out


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"patches": 5}', "\xff"])
def test_doctor_names_a_corrupt_plugin_status(tmp_path, capsys, monkeypatch, content):
    status = tmp_path / "plugin-status.json"
    status.write_text(content, errors="surrogateescape")
    monkeypatch.setattr(doctor, "default_status_file", lambda: status)
    code, out = _run_cli(["doctor"], capsys)
    assert code == 1 and f"plugin status {status} is unreadable" in out, out


def test_doctor_expect_hash_takes_the_master_addr_flag(capsys, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    code, out = _run_cli(["doctor", "--topology", "tp4-pp2-2nodes", "--expect-hash", "0" * 16],
                         capsys)  # fmt: skip
    assert code == 2 and "needs node 0's address: --master-addr" in out
    from deepinfer_sm80.deploy.launcher import NodeSettings, render
    from deepinfer_sm80.deploy.topology import load, validate

    want = render(validate(*load("tp4-pp2-2nodes")), NodeSettings(0, "10.0.0.1")).config_hash()
    code, out = _run_cli(["doctor", "--topology", "tp4-pp2-2nodes", "--expect-hash", want,
                          "--master-addr", "10.0.0.1"], capsys)  # fmt: skip
    assert f"[ok] config-hash: this node renders {want}" in out


def test_doctor_expect_hash_of_a_refused_topology_names_the_refusal(capsys, monkeypatch):
    """A topology the launch refuses renders no command on any node: doctor says why
    instead of comparing a hash no node would print."""
    monkeypatch.delenv("DEEPINFER_PP_RELAY", raising=False)
    code, out = _run_cli(["doctor", "--topology", "tp2-pp3", "--expect-hash", "0" * 16],
                         capsys)  # fmt: skip
    assert code == 2 and "splits the sharing group" in out
    assert "refused at launch: no node renders a command" in out
    assert "config-hash" not in out
