"""benchmarks/e2e's phases end to end against stand-in servers (tests/benchmarks/fake_vllm.py).

Real ``vllm serve`` processes need a GPU; the stand-ins speak the same API, so the
orchestration (launcher rendering, server lifecycle, probes, `deepinfer launch` and
`deepinfer health --ready`, /metrics, the report) is checked here, including which
perturbed checkpoints (the controls' ladder) are flagged.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.e2e import run
from benchmarks.e2e.run import CONTROLS

ROOT = Path(__file__).resolve().parents[2]
FAKE_BIN = Path(__file__).parent / "fake_bin"


def _checkpoint(d: Path, scale: float = 1.0) -> str:
    """A folder the stand-in serves; ``scale`` multiplies its logprobs (a perturbation)."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": 512, "fake_logprob_scale": scale}))
    vocab = {f"b{i}": i for i in range(512)}
    added = [{"id": i} for i in range(256, 512)]
    (d / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": vocab}, "added_tokens": added})
    )
    return str(d)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port_base(span: int = 11) -> int:
    """A base whose ``span`` ports are free here now: the correctness phase's stand-in
    servers listen on base + 1 to base + 10, clear of any server already running."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + span < 65536 and all(_port_free(base + i) for i in range(span)):
            return base
    raise RuntimeError(f"no {span} consecutive free ports found")


def _run(*args, out: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    deepinfer = shutil.which("deepinfer") or str(Path(sys.executable).parent / "deepinfer")
    env = {
        **os.environ,
        **(env_extra or {}),
        "FAKE_PYTHON": sys.executable,
        "PATH": f"{FAKE_BIN}:{Path(deepinfer).parent}:{os.environ['PATH']}",
        "PYTHONPATH": f"{ROOT / 'overlay'}:{ROOT}",
    }
    if args[0] == "correctness" and "--port-base" not in args:
        args = (*args, "--port-base", str(_free_port_base()))
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.e2e", *args, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip


def _controls(root: Path, scales: dict[str, float]) -> None:
    """Each control's checkpoint beside the base one, with its stand-in perturbation."""
    for c in CONTROLS:
        _checkpoint(root / c.checkpoint, scales.get(c.label, 1.05))


def test_phases_and_report_against_stand_in_servers(tmp_path):
    model = _checkpoint(tmp_path / "smoke")
    _controls(tmp_path, {})
    out = tmp_path / "out"
    common = ["--model", model, "--max-len", "300", "--stagger-s", "0"]
    r = _run("correctness", *common, out=out)
    assert r.returncode == 0, r.stdout + r.stderr
    corr = json.loads((out / "correctness.json").read_text())
    assert all("ready_s" in s for s in corr["servers"].values()), corr["servers"]
    assert "--enforce-eager" in corr["servers"]["stock-eager"]["argv"]
    assert "--enforce-eager" not in corr["servers"]["ours-graphs"]["argv"]
    for c in CONTROLS:  # stock, eager, its own checkpoint, in both schedules
        argv = corr["servers"][c.server]["argv"]
        assert argv[2] == str(tmp_path / c.checkpoint) and "--enforce-eager" in argv
        assert "--kv-cache-memory-bytes" in argv
        assert set(corr["runs"][c.server]) == {"sequential", "concurrent"}
    assert set(corr["runs"]["stock-eager-chunk2048"]) == {"sequential", "concurrent"}
    assert set(corr["throughput"]) == {"stock-graphs", "ours-graphs"}
    assert corr["throughput"]["ours-graphs"]["decode_c16"]["aggregate_tok_s"] > 0
    caches = {k: tmp_path / "caches" / k for k in run.COMPILE_CACHE_ENVS}
    for folder in caches.values():
        folder.mkdir(parents=True)
        (folder / "compiled-before").write_text("x")
    r = _run("speculative", *common, "--cold-starts", out=out,
             env_extra={k: str(v) for k, v in caches.items()})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(f.is_dir() and not (f / "compiled-before").exists() for f in caches.values())
    assert r.stdout.count("compile caches emptied") == 2
    spec = json.loads((out / "speculative.json").read_text())
    assert all(v["cold"] for v in spec["servers"].values())
    for name in ("ours-spec-launch", "stock-spec-launch"):  # the same command, both paths
        assert spec["servers"][name]["argv"][:2] == ["deepinfer", "launch"]
        assert spec["health"][name]["rc"] == 0
        assert spec["servers"][name]["triton_compiled_at_start"] == {}
        assert spec["servers"][name]["aot_triton_misses"] == []
    # One server at a time: the launched server (0.75 of the GPU) is probed and stopped
    # before stock starts.
    events = [ln.split("] ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("[")]
    probed = next(i for i, e in enumerate(events) if e.startswith("ours-spec-launch: probes"))
    ready = next(i for i, e in enumerate(events) if e.startswith("stock-spec-launch: ready"))
    assert probed < ready, events
    r = _run("report", out=out)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    comps = rep["comparisons"]
    assert comps["ours vs stock, CUDA graphs, batch 16"]["within"]
    assert not any(comps[c.comparison]["within"] for c in CONTROLS)
    assert rep["verdict"]["result"] == "PASS"
    assert "resolving power: flags L24 1%, L39 1%, L24 10%, L24 50%\n" in r.stdout
    eq = rep["speculative"]["ours-spec-launch greedy vs ours-graphs greedy"]
    assert eq["equal_prompts"] == eq["prompts"] > 0
    check = rep["speculative"]["ours-spec-launch greedy check"]
    assert check["greedy"] and check["positions"] == 24 * eq["prompts"], check
    assert check["max_margin"] == 0.0
    assert "OUTSIDE" in r.stdout and "WITHIN" in r.stdout
    assert "ours-spec-launch start (from emptied compile caches): ready after" in r.stdout
    assert set(rep["starts"]) == {"ours-spec-launch", "stock-spec-launch"}
    cold = rep["cold_start"]
    assert cold["ours_over_stock"] == cold["ours_s"] / cold["stock_s"] > 0
    assert "cold start to the first token, both by deepinfer launch: ours" in r.stdout
    for name, v in rep["starts"].items():  # the first request returned after the server was up
        assert v["first_token_s"] >= v["ready_s"] > 0, (name, v)
    assert cold["ready_ours_s"] == rep["starts"]["ours-spec-launch"]["ready_s"]
    for v in rep["starts"].values():  # the steps each server's log names
        assert v["timeline"] == {"model_loading_s": 0.25, "init_engine_s": 0.5}
    assert "model loading 0 s; engine init in all 0 s; Triton JIT while serving: none" in r.stdout
    # --starts-only: the same two cold starts and health checks, no probes.
    starts = tmp_path / "starts"
    r = _run("speculative", *common, "--cold-starts", "--starts-only", out=starts,
             env_extra={k: str(v) for k, v in caches.items()})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "probes in" not in r.stdout
    spec_only = json.loads((starts / "speculative.json").read_text())
    assert spec_only["runs"] == {}
    assert all(spec_only["health"][n]["rc"] == 0 for n in spec_only["servers"])
    r = _run("report", "--records", str(out / "correctness.json"), "--speculative",
             str(starts / "speculative.json"), out=starts)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cold start to the first token, both by deepinfer launch: ours" in r.stdout
    assert json.loads((starts / "report.json").read_text())["cold_start"]["stock_s"] > 0
    # --only ours: that path alone, and no comparison; its first request is made to fail,
    # which the record keeps and the report prints (the start is not fatal).
    r = _run("speculative", *common, "--cold-starts", "--starts-only", "--only", "ours",
             out=starts, env_extra={**{k: str(v) for k, v in caches.items()},
                                    "FAKE_REFUSE_TOKEN_PROMPTS": "1"})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(json.loads((starts / "speculative.json").read_text())["servers"]) == [
        "ours-spec-launch"
    ]
    r = _run("report", "--records", str(out / "correctness.json"), "--speculative",
             str(starts / "speculative.json"), out=starts)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cold start to the first token" not in r.stdout
    assert "ours-spec-launch start (from emptied compile caches): ready after" in r.stdout
    assert ", first request failed: " in r.stdout and "500" in r.stdout
    # The compact records alone (what comes back from a GPU machine) give the same report.
    waves = sorted(out.glob("wave-*.npz"))
    assert [w.name for w in waves] == ["wave-controls.npz", "wave-eager.npz", "wave-graphs.npz"]
    copied = tmp_path / "copied"
    r = _run("report", "--records", *map(str, waves), "--speculative",
             str(out / "speculative.npz"), out=copied)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rep_copied = json.loads((copied / "report.json").read_text())
    for key in ("bound", "comparisons", "speculative", "health", "verdict"):
        assert rep_copied[key] == rep[key], key


def test_a_ladder_whose_smallest_controls_hide_still_passes_and_says_so(tmp_path):
    model = _checkpoint(tmp_path / "smoke")
    _controls(tmp_path, {"L24 1%": 1.0, "L39 1%": 1.0})  # invisible; L24 10% is not
    out = tmp_path / "out"
    r = _run("correctness", "--model", model, "--max-len", "100", "--stagger-s", "0",
             "--no-throughput", out=out)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run("report", out=out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resolving power: flags L24 10%, L24 50%; not L24 1%, L39 1%\n" in r.stdout
    assert "verdict: PASS" in r.stdout and "the bound flags L24 10%, L24 50%" in r.stdout


def test_correctness_refuses_missing_control_checkpoints(tmp_path):
    model = _checkpoint(tmp_path / "smoke")
    r = _run("correctness", "--model", model, out=tmp_path / "out")
    assert r.returncode == 2
    assert "control checkpoints missing" in r.stderr and "smoke-perturbed" in r.stderr


def test_a_server_that_dies_is_reported_not_fatal(tmp_path, monkeypatch):
    model = _checkpoint(tmp_path / "smoke")
    _controls(tmp_path, {})
    out = tmp_path / "out"
    monkeypatch.setenv("FAKE_VLLM_EXIT", "stock-eager-chunk2048")
    r = _run("correctness", "--model", model, "--max-len", "100", "--stagger-s", "0",
             "--no-throughput", out=out)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    corr = json.loads((out / "correctness.json").read_text())
    assert "exited with 3" in corr["servers"]["stock-eager-chunk2048"]["error"]
    assert "ready_s" in corr["servers"]["stock-eager"]
    with pytest.raises(KeyError):
        corr["runs"]["stock-eager-chunk2048"]


def test_a_port_another_server_holds_is_refused_not_taken_for_ours(tmp_path, monkeypatch):
    """A listener already on a server's port would answer its readiness polls: that server
    is refused at start and recorded as failed (even one made to exit at once, whose polls
    the other listener would answer); the others run."""
    model = _checkpoint(tmp_path / "smoke")
    _controls(tmp_path, {})
    out, base = tmp_path / "out", _free_port_base()
    monkeypatch.setenv("FAKE_VLLM_EXIT", "stock-eager-chunk2048")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base + 4))  # stock-eager-chunk2048's port
        squatter.listen()
        r = _run("correctness", "--model", model, "--max-len", "100", "--stagger-s", "0",
                 "--no-throughput", "--port-base", str(base), out=out)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    corr = json.loads((out / "correctness.json").read_text())
    error = corr["servers"]["stock-eager-chunk2048"]["error"]
    assert f"port {base + 4} already answers" in error
    assert "stock-eager-chunk2048" not in corr["runs"]
    assert "ready_s" in corr["servers"]["stock-eager"] and "stock-eager" in corr["runs"]


def test_no_wave_holds_more_servers_than_fit_an_80_gb_gpu(tmp_path):
    """Every server and every control is in a wave, none twice, and no wave has more than
    SERVERS_PER_WAVE servers."""
    args = argparse.Namespace(
        model=str(tmp_path),
        util=0.15,
        controls_dir=tmp_path,
        waves=list(run.WAVES),
        servers_per_wave=run.SERVERS_PER_WAVE,
        port_base=8100,
    )
    waves = run.correctness_waves(args)
    names = [spec.name for wave in waves for spec, _ in wave]
    assert max(len(w) for w in waves) <= run.SERVERS_PER_WAVE == 3
    assert len(names) == len(set(names))
    assert {c.server for c in CONTROLS} | {"stock-eager", "ours-eager", "ours-graphs"} <= set(names)
    assert [spec.name for spec, _ in waves[0]][:2] == ["stock-eager", "ours-eager"]


def test_waves_run_alone_and_the_graphs_wave_alone_has_no_controls(tmp_path):
    """--waves graphs: the CUDA-graph servers and the chunked-prefill variation, no control
    (the controls are compared with stock eager, which that run lacks); --waves eager: the
    eager servers and the first controls."""

    def names(*waves, per_wave=run.SERVERS_PER_WAVE):
        args = argparse.Namespace(model="m", util=0.15, controls_dir=tmp_path, waves=list(waves),
                                  servers_per_wave=per_wave, port_base=8100)  # fmt: skip
        return [[spec.name for spec, _ in wave] for wave in run.correctness_waves(args)]

    assert names("graphs") == [["stock-graphs", "ours-graphs", "stock-eager-chunk2048"]]
    (eager,) = names("eager")
    assert eager[:2] == ["stock-eager", "ours-eager"] and eager[2] == CONTROLS[0].server
    assert names("eager", "controls") == [eager, [c.server for c in CONTROLS[1:]]]
    # Five at once (a 141 GB GPU): the controls fill the eager wave, then the graphs wave;
    # no controls wave.
    controls = [c.server for c in CONTROLS]
    assert names(*run.WAVES, per_wave=5) == [
        ["stock-eager", "ours-eager", *controls[:3]],
        ["stock-graphs", "ours-graphs", "stock-eager-chunk2048", *controls[3:]],
    ]
    assert len(controls) == 4  # three in the eager wave, one beside the graphs servers
    with pytest.raises(ValueError, match="do not fit the waves of 2 servers"):
        names(*run.WAVES, per_wave=2)


def test_the_graphs_wave_alone_needs_no_control_checkpoints(tmp_path, monkeypatch):
    """Without the eager wave no control runs, so main() must not ask for their
    checkpoints; with it, a missing control is an error that names the folder."""
    ran = []
    monkeypatch.setattr(run, "phase_correctness", lambda args: ran.append(args.waves) or {})
    model = tmp_path / "smoke"
    model.mkdir()
    common = ["correctness", "--model", str(model), "--out", str(tmp_path / "out")]
    assert run.main([*common, "--waves", "graphs"]) == 0
    assert ran == [["graphs"]]
    with pytest.raises(SystemExit) as stop:
        run.main([*common, "--waves", "eager"])
    assert stop.value.code == 2 and ran == [["graphs"]]


def test_each_finished_wave_is_saved_before_the_next_starts(tmp_path, monkeypatch):
    """A phase cut short in its last wave still leaves the earlier waves' runs on disk."""
    args = argparse.Namespace(
        model="m", out=tmp_path, util=0.15, controls_dir=tmp_path, waves=list(run.WAVES),
        max_len=None, stagger_s=0, throughput=False, servers_per_wave=run.SERVERS_PER_WAVE,
        port_base=8100,
    )  # fmt: skip
    monkeypatch.setattr(run, "load_prompts", lambda model, max_len: {"p": [1, 2]})
    monkeypatch.setattr(run, "environment", lambda: {})
    waves_seen = []

    def fake_wave(args, wave, prompts, result, servers):
        names = [spec.name for spec, _ in wave]
        if "ours-graphs" in names:
            raise RuntimeError("machine taken back")
        waves_seen.append(names)
        result["runs"].update({n: {"sequential": {}} for n in names})
        return servers

    monkeypatch.setattr(run, "run_wave", fake_wave)
    with pytest.raises(RuntimeError):
        run.phase_correctness(args)
    saved = json.loads((tmp_path / "correctness.json").read_text())
    assert len(waves_seen) == 2
    assert set(saved["runs"]) == {n for w in waves_seen for n in w}
    assert "ours-graphs" not in saved["runs"]


def test_controls_names_which_controls_run_and_which_checkpoints_are_needed(tmp_path, monkeypatch):
    """--controls L24-50pct: that control alone takes the eager wave's free place; only its
    checkpoint must exist; the report says the others are not measured."""
    args = argparse.Namespace(model="m", util=0.15, controls_dir=tmp_path,
                              waves=["eager", "graphs"], servers_per_wave=3,
                              controls=["L24-50pct"], port_base=8100)  # fmt: skip
    waves = [[spec.name for spec, _ in wave] for wave in run.correctness_waves(args)]
    assert waves == [
        ["stock-eager", "ours-eager", "control-L24-50pct"],
        ["stock-graphs", "ours-graphs", "stock-eager-chunk2048"],
    ]
    ran = []
    monkeypatch.setattr(run, "phase_correctness", lambda a: ran.append(a.controls) or {})
    model = tmp_path / "smoke"
    model.mkdir()
    common = ["correctness", "--model", str(model), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit):  # its checkpoint is missing
        run.main([*common, "--controls", "L24-50pct"])
    (tmp_path / "smoke-perturbed-L24-50pct").mkdir()
    assert run.main([*common, "--controls", "L24-50pct"]) == 0
    assert ran == [["L24-50pct"]]
    with pytest.raises(SystemExit):
        run.main([*common, "--controls", "L24-2pct"])
    assert run.resolving_power({}) == "not measured L24 1%, L39 1%, L24 10%, L24 50%"


def test_ttft_prompts_share_no_prefix_cache_block_with_any_other_prompt():
    """vLLM's prefix cache serves a prompt's blocks only when its first block equals a
    cached one (hashes chain from the first block). A TTFT prompt whose start matched a
    probe prompt, or another TTFT prompt, would time a cache hit: the 32K-token prompts
    once started with the longest probe prompt, and with the 8K ones."""
    from benchmarks.e2e.prompts import make_prompts

    prompts = make_prompts(list(range(3, 384)), seed=0)  # the smoke vocabulary's ordinary ids
    fresh = run.fresh_prompts(prompts)
    assert {n: len(v) for n, v in fresh.items()} == {8192: 3, 32768: 3}
    assert all(len(ids) == n for n, v in fresh.items() for ids in v)
    timed = [ids for v in fresh.values() for ids in v]
    starts = [ids[:16] for ids in timed] + [ids[:16] for ids in prompts.values()]
    assert len(set(map(tuple, starts))) == len(starts)
    assert len({ids[0] for ids in timed} | {ids[0] for ids in prompts.values()}) == len(starts)

    def old_formula(n, rep):  # the formula that timed cache hits: must fail the same check
        base = max(prompts.values(), key=len)
        ids = [base[(i + 7919 * rep) % len(base)] for i in range(n)]
        ids[0] = base[rep]
        return ids

    old = [old_formula(n, rep) for n in (8192, 32768) for rep in range(3)]
    old_starts = [ids[:16] for ids in old] + [ids[:16] for ids in prompts.values()]
    assert len(set(map(tuple, old_starts))) < len(old_starts)
    with pytest.raises(ValueError, match="larger vocabulary"):
        run.fresh_prompts({"a": [1, 2, 3], "b": [2, 1]})


def test_wave_files_merged_give_the_report_of_the_whole_record(tmp_path):
    """Each wave also leaves wave-<name>.npz; `report --records` over those files (as if
    copied off two machines) says what `report` over correctness.json says."""
    model = _checkpoint(tmp_path / "smoke")
    _controls(tmp_path, {})
    out = tmp_path / "out"
    r = _run("correctness", "--model", model, "--max-len", "100", "--stagger-s", "0",
             "--waves", "eager", "graphs", "--controls", "L24-50pct", out=out)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.glob("wave-*.npz")) == ["wave-eager.npz", "wave-graphs.npz"]
    whole = _run("report", out=out)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    rep_whole = json.loads((out / "report.json").read_text())
    elsewhere = tmp_path / "copied"
    elsewhere.mkdir()
    for name in ("wave-graphs.npz", "wave-eager.npz"):
        shutil.copy(out / name, elsewhere / name)
    merged = _run("report", "--records", str(elsewhere / "wave-eager.npz"),
                  str(elsewhere / "wave-graphs.npz"), out=elsewhere)  # fmt: skip
    assert merged.returncode == 0, merged.stdout + merged.stderr
    rep = json.loads((elsewhere / "report.json").read_text())
    assert rep["comparisons"] == rep_whole["comparisons"] and rep["bound"] == rep_whole["bound"]
    assert rep["verdict"]["result"] == "PASS"
    assert [Path(m["record"]).name for m in rep["records"]] == ["wave-eager.npz", "wave-graphs.npz"]
    # One wave alone cannot pass: the CUDA-graph comparisons are not measured.
    alone = _run("report", "--records", str(elsewhere / "wave-eager.npz"), out=elsewhere)
    assert alone.returncode == 1 and "CUDA graphs, batch 1: not measured" in alone.stdout
    # The same wave twice is refused, naming the server.
    twice = _run("report", "--records", str(elsewhere / "wave-eager.npz"),
                 str(out / "wave-eager.npz"), out=elsewhere)  # fmt: skip
    assert twice.returncode == 2 and "'control-L24-50pct' is in both" in twice.stderr


def test_a_speculative_server_that_emits_a_non_greedy_token_fails_the_report(tmp_path):
    """The stand-in's DSpark server accepts one draft token the target model ranks 0.5 nats
    or more below its top-1: the greedy check on the same server flags every prompt, and
    the report fails although the non-speculative comparisons pass."""
    model = _checkpoint(tmp_path / "smoke")
    _controls(tmp_path, {})
    out = tmp_path / "out"
    common = ["--model", model, "--max-len", "100", "--stagger-s", "0", "--no-throughput"]
    assert _run("correctness", *common, out=out).returncode == 0
    r = _run("speculative", *common, out=out, env_extra={"FAKE_SPEC_ACCEPTS_WRONG": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run("report", out=out)
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    check = rep["speculative"]["ours-spec-launch greedy check"]
    assert not check["greedy"] and check["max_margin"] >= 0.5
    assert (
        len(check["outside"])
        == rep["speculative"]["ours-spec-launch greedy vs ours-graphs greedy"]["prompts"]
    )
    assert rep["verdict"]["result"] == "FAIL" and "not its greedy choice" in rep["verdict"]["why"]


def test_cold_starts_refuse_to_empty_caches_they_are_not_given(tmp_path):
    """--cold-starts empties only compile caches the environment names (a default one is
    the user's own), and only for the speculative phase."""
    model = _checkpoint(tmp_path / "smoke")
    blank = dict.fromkeys(run.COMPILE_CACHE_ENVS, "")
    r = _run("speculative", "--model", model, "--cold-starts", out=tmp_path / "out",
             env_extra=blank)  # fmt: skip
    assert r.returncode == 2 and "TRITON_CACHE_DIR" in r.stderr and "must name" in r.stderr
    r = _run("correctness", "--model", model, "--cold-starts", out=tmp_path / "out")
    assert r.returncode == 2 and "speculative phase's option" in r.stderr


def test_triton_compiles_counts_what_the_aot_folder_did_not_bring(tmp_path):
    """After a cold start the Triton cache holds the seeded AOT entries and what the
    server compiled; only the latter are counted, by kernel name."""
    cache, aot = tmp_path / "cache", tmp_path / "aot"
    gather, softmax = "kv_gather_v4_kernel", "_topk_log_softmax_kernel"
    for entry, kernel in (
        ("SEEDED1", gather),
        ("NEW1", gather),
        ("NEW2", gather),
        ("NEW3", softmax),
    ):
        (cache / entry).mkdir(parents=True)
        (cache / entry / f"__grp__{kernel}.json").write_text("{}")
    (cache / "UTIL").mkdir()
    (cache / "UTIL" / "cuda_utils.so").write_bytes(b"")
    aot.mkdir()
    (aot / "manifest.json").write_text(json.dumps({"entries": ["SEEDED1"]}))
    counted = run.triton_compiles(cache, str(aot))
    assert counted == {
        "(no kernel: a launcher or utility module)": 1,
        "_topk_log_softmax_kernel": 1,
        "kv_gather_v4_kernel": 2,
    }
    assert run.triton_compiles(cache, None)["kv_gather_v4_kernel"] == 3
    assert run.triton_compiles(tmp_path / "absent", None) == {}


def test_cold_start_comparison_needs_both_cold_launches():
    ours = {"ready_s": 290.0, "first_token_s": 300.0, "cold": True}
    stock = {"ready_s": 395.0, "first_token_s": 400.0, "cold": True}
    both = {"ours-spec-launch": ours, "stock-spec-launch": stock}
    assert run.cold_start_comparison(both) == {
        "ours_s": 300.0, "stock_s": 400.0, "ours_over_stock": 0.75, "ours_faster": True,
        "ready_ours_s": 290.0, "ready_stock_s": 395.0,
    }  # fmt: skip
    # Compared by the first token: a server ready sooner but slower to its first token is
    # not the faster start.
    late_first = {**ours, "ready_s": 100.0, "first_token_s": 450.0}
    assert not run.cold_start_comparison({**both, "ours-spec-launch": late_first})["ours_faster"]
    no_first = {k: v for k, v in ours.items() if k != "first_token_s"}
    assert run.cold_start_comparison({**both, "ours-spec-launch": no_first}) is None
    assert (
        run.cold_start_comparison({**both, "stock-spec-launch": {**stock, "cold": False}}) is None
    )
    assert run.cold_start_comparison({"ours-spec-launch": ours, "stock-spec": stock}) is None
    assert run.cold_start_comparison({**both, "ours-spec-launch": {"cold": True}}) is None
