"""The end-to-end comparison's pure parts: prompts, probes' parsing, agreement, bound, rendering."""

import json
import math
import random

import pytest

from benchmarks.e2e import agreement, probes, prompts
from benchmarks.e2e.servers import ServerSpec, render


def _run(logprob_rows: dict[str, list[float]], greedy=None, top1=None) -> dict:
    out = {}
    for name, lps in logprob_rows.items():
        out[name] = {
            "prompt_sha256": name,
            "logprobs": list(lps),
            "top1": list(top1[name]) if top1 else [0] * len(lps),
            "greedy": list(greedy[name]) if greedy else [1, 2, 3],
        }
    return {"prompts": out}


def _noisy(base: dict[str, list[float]], scale: float, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    return {n: [x + rng.gauss(0, scale) for x in v] for n, v in base.items()}


@pytest.fixture
def base():
    rng = random.Random(1)
    return {f"p{i}": [-rng.uniform(0.5, 8.0) for _ in range(200 + 37 * i)] for i in range(6)}


def test_identical_runs_have_zero_delta(base):
    d = agreement.compare_runs(_run(base), _run(base))
    s = agreement.summarize(d)
    assert s["max_abs"] == 0 and s["mean_abs"] == 0 and s["top1_agreement"] == 1.0
    assert s["greedy_equal_prompts"] == 6 and s["first_greedy_divergence"] is None


def test_bound_is_factor_times_the_stock_variation(base):
    var = agreement.compare_runs(_run(base), _run(_noisy(base, 0.05, 2)))
    bound = agreement.bound_from_variation({"batch": var}, factor=2.0)
    assert bound.max_abs == pytest.approx(2 * max(x.max_abs for x in var))
    assert bound.mean_abs == pytest.approx(2 * max(x.mean_abs for x in var))


def test_bound_floors_when_the_stock_path_is_bit_identical(base):
    same = agreement.compare_runs(_run(base), _run(base))
    bound = agreement.bound_from_variation({"batch": same})
    assert (bound.max_abs, bound.mean_abs) == (agreement.MAX_FLOOR, agreement.MEAN_FLOOR)


def test_bound_needs_a_variation():
    with pytest.raises(ValueError, match="at least one variation"):
        agreement.bound_from_variation({})


def test_candidate_as_noisy_as_the_stock_path_is_within(base):
    var = agreement.compare_runs(_run(base), _run(_noisy(base, 0.05, 2)))
    bound = agreement.bound_from_variation({"batch": var})
    cand = agreement.compare_runs(_run(_noisy(base, 0.05, 3)), _run(base))
    assert agreement.verdict(cand, bound)["within"]


def test_the_pooled_bound_is_tight_and_catches_what_each_prompt_hides(base):
    """Rounding noise pools to a stable mean over many positions; a candidate with its own
    noise plus a small systematic change stays inside every per-prompt bound (2x) but
    moves the pooled mean past 1.1x the stock path's."""
    var = agreement.compare_runs(_run(_noisy(base, 0.05, 1)), _run(_noisy(base, 0.05, 2)))
    bound = agreement.bound_from_variation({"batch": var}, factor=2.0)
    pooled = agreement.summarize(var)["mean_abs"]
    assert bound.aggregate_mean_abs == pytest.approx(agreement.AGGREGATE_FACTOR * pooled)
    assert bound.aggregate_mean_abs < bound.mean_abs  # tighter than the per-prompt bound

    def candidate(shift):
        noisy = _noisy(base, 0.05, 3)
        return agreement.compare_runs(
            _run({n: [x + shift for x in v] for n, v in noisy.items()}), _run(_noisy(base, 0.05, 4))
        )

    assert agreement.verdict(candidate(0.0), bound)["within"]
    v = agreement.verdict(candidate(0.05), bound)
    assert not v["within"] and not v["pooled_within"] and v["outside"] == []


# Mutants of a candidate that must be flagged against a bound from small stock noise.
def _scaled(base):
    return {n: [x * 1.01 for x in v] for n, v in base.items()}


def _shifted_row(base):  # each position reads its neighbour's logprob
    return {n: v[1:] + v[:1] for n, v in base.items()}


def _one_prompt_wrong(base):
    out = dict(base)
    out["p3"] = [x - 0.5 for x in base["p3"]]
    return out


def _one_nan(base):
    out = {n: list(v) for n, v in base.items()}
    out["p2"][17] = math.nan
    return out


@pytest.mark.parametrize("mutant", [_scaled, _shifted_row, _one_prompt_wrong, _one_nan])
def test_mutants_are_outside_the_bound(base, mutant):
    var = agreement.compare_runs(_run(base), _run(_noisy(base, 0.005, 2)))
    bound = agreement.bound_from_variation({"batch": var})
    v = agreement.verdict(agreement.compare_runs(_run(mutant(base)), _run(base)), bound)
    assert not v["within"]
    assert v["outside"]


def test_top1_and_greedy_divergence_are_counted(base):
    top_a = {n: [1] * len(v) for n, v in base.items()}
    top_b = {n: [1] * len(v) for n, v in base.items()}
    top_b["p0"][:50] = [2] * 50
    greedy_b = {n: [1, 2, 3] for n in base}
    greedy_b["p4"] = [1, 9, 3]
    d = agreement.compare_runs(_run(base, top1=top_a), _run(base, top1=top_b, greedy=greedy_b))
    by = {x.prompt: x for x in d}
    assert by["p0"].top1_agreement == pytest.approx(1 - 50 / len(base["p0"]))
    assert by["p4"].first_greedy_divergence == 1
    assert agreement.summarize(d)["greedy_equal_prompts"] == 5


def test_different_sequences_are_refused(base):
    a, b = _run(base), _run(base)
    b["prompts"]["p1"]["prompt_sha256"] = "other"
    with pytest.raises(ValueError, match="different token sequences"):
        agreement.compare_runs(a, b)
    del b["prompts"]["p1"]
    with pytest.raises(ValueError, match="different prompt sets"):
        agreement.compare_runs(a, b)


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [([1, 2], [1, 2], None), ([1, 2], [1, 3], 1), ([1], [1, 2], 1), (None, [1], None)],
)
def test_first_divergence(a, b, want):
    assert agreement.first_divergence(a, b) == want


def test_prompts_are_deterministic_and_cover_the_lengths():
    ids = list(range(3, 259))
    a, b = prompts.make_prompts(ids, seed=0), prompts.make_prompts(ids, seed=0)
    assert a == b
    assert len(a) >= 32
    assert sum(1 for v in a.values() if len(v) >= 32768) >= 4
    assert all(len(v) == int(n[3:]) for n, v in a.items())
    assert all(set(v) <= set(ids) for v in a.values())
    assert prompts.make_prompts(ids, seed=1) != a
    assert max(map(len, prompts.make_prompts(ids, max_len=1000).values())) <= 1000


def test_ordinary_ids_leave_special_tokens_out():
    tok = {"model": {"vocab": {"a": 0, "b": 1, "<s>": 2, "c": 600}}, "added_tokens": [{"id": 2}]}
    assert prompts.ordinary_token_ids(tok, vocab_size=512) == [0, 1]
    with pytest.raises(ValueError, match="no ordinary tokens"):
        prompts.ordinary_token_ids({"model": {"vocab": {}}}, 512)


class _FakeClient:
    def __init__(self, resp):
        self.resp = resp
        self.bodies = []

    def post_json(self, path, body):
        self.bodies.append(body)
        return self.resp


def test_teacher_forced_parses_token_id_keys():
    ids = [5, 6, 7]
    resp = {
        "choices": [
            {
                "logprobs": {
                    "tokens": ["token_id:5", "token_id:6", "token_id:7", "token_id:9"],
                    "token_logprobs": [None, -1.5, -0.25, -0.1],
                    "top_logprobs": [
                        None,
                        {"token_id:6": -1.5, "token_id:8": -0.5},
                        {"token_id:7": -0.25},
                        {"token_id:9": -0.1},
                    ],
                }
            }
        ]
    }
    client = _FakeClient(resp)
    rec = probes.teacher_forced(client, "m", ids)
    assert rec["logprobs"] == [-1.5, -0.25]
    assert rec["top1"] == [8, 7]
    assert client.bodies[0]["echo"] and client.bodies[0]["return_tokens_as_token_ids"]
    resp["choices"][0]["logprobs"]["tokens"][1] = "token_id:4"
    with pytest.raises(ValueError, match="echoed other token ids"):
        probes.teacher_forced(client, "m", ids)


def test_greedy_checks_the_token_count():
    resp = {"choices": [{"logprobs": {"tokens": ["token_id:1", "token_id:2"]}}]}
    assert probes.greedy(_FakeClient(resp), "m", [1], max_tokens=2) == [1, 2]
    with pytest.raises(ValueError, match="asked for 3"):
        probes.greedy(_FakeClient(resp), "m", [1], max_tokens=3)


def test_servers_render_the_launchers_command_with_the_mode():
    eager, _ = render(ServerSpec("s", "stock", "/ckpt", 8123, eager=True, speculative=False))
    assert eager[:3] == ["vllm", "serve", "/ckpt"]
    assert "--enforce-eager" in eager and "--speculative-config" not in eager
    assert eager[eager.index("--kv-cache-memory-bytes") + 1] == str(6 * 2**30)
    assert eager[eager.index("--port") + 1] == "8123"
    assert eager[eager.index("--max-model-len") + 1] == "1048576"
    graphs, _ = render(ServerSpec("s", "ours", "/ckpt", 8124, eager=False, speculative=True))
    assert "--enforce-eager" not in graphs
    assert (
        json.loads(graphs[graphs.index("--speculative-config") + 1])["num_speculative_tokens"] == 5
    )
    with pytest.raises(ValueError, match="stock or ours"):
        ServerSpec("s", "other", "/ckpt", 1)


def _ladder(base, scales: dict[str, float]) -> dict:
    """Each control one request at a time, its logprobs scaled (1.05 unless named)."""
    from benchmarks.e2e.run import CONTROLS

    def scaled(k):
        return {n: [x * k for x in v] for n, v in base.items()}

    return {c.server: {"sequential": _run(scaled(scales.get(c.label, 1.05)))} for c in CONTROLS}


def _close_record(base, scales=None) -> dict:
    def runs(lps):
        return {"sequential": _run(lps), "concurrent": _run(lps)}

    return {
        "runs": {
            "stock-eager": {"sequential": _run(base), "concurrent": _run(_noisy(base, 0.01, 1))},
            "stock-graphs": runs(_noisy(base, 0.01, 2)),
            "stock-eager-chunk2048": runs(_noisy(base, 0.01, 3)),
            "ours-eager": runs(_noisy(base, 0.01, 4)),
            "ours-graphs": runs(_noisy(base, 0.01, 5)),
            **_ladder(base, scales or {}),
        }
    }


def test_report_flags_the_negative_control_and_passes_a_close_candidate(base):
    from benchmarks.e2e.run import CONTROLS, report

    rep = report(_close_record(base), None, factor=2.0)
    comps = rep["comparisons"]
    assert comps["ours vs stock, eager, batch 16"]["within"]
    assert comps["ours vs stock, CUDA graphs, batch 1"]["within"]
    assert not any(comps[c.comparison]["within"] for c in CONTROLS)
    assert rep["verdict"]["result"] == "PASS"
    assert rep["verdict"]["resolving_power"] == "flags L24 1%, L39 1%, L24 10%, L24 50%"
    assert set(rep["bound"]["sources"]) == {
        "stock batch 1 vs 16 (eager)",
        "stock batch 1 vs 16 (graphs)",
        "stock eager vs graphs",
        "stock prefill chunk 8192 vs 2048",
    }


@pytest.mark.parametrize(
    ("scales", "result", "power"),
    [
        ({"L24 1%": 1}, "PASS", "flags L39 1%, L24 10%, L24 50%; not L24 1%"),
        ({"L24 1%": 1, "L39 1%": 1}, "PASS", "flags L24 10%, L24 50%; not L24 1%, L39 1%"),
        ({"L24 1%": 1, "L39 1%": 1, "L24 10%": 1}, "PASS",
         "flags L24 50%; not L24 1%, L39 1%, L24 10%"),
        ({"L24 1%": 1, "L39 1%": 1, "L24 10%": 1, "L24 50%": 1}, "NO VERDICT",
         "not L24 1%, L39 1%, L24 10%, L24 50%"),
    ],
)  # fmt: skip
def test_the_ladder_names_what_the_bound_resolves(base, scales, result, power):
    """A pass needs the bound to flag some control (the comparison can fail), not one in
    particular; the resolving power says which it flags."""
    from benchmarks.e2e.run import report

    v = report(_close_record(base, scales), None, factor=2.0)["verdict"]
    assert (v["result"], v["resolving_power"]) == (result, power)
    flagged = power.split(";")[0].removeprefix("flags ")
    if result == "PASS":
        assert v["why"] == f"ours within the bound everywhere; the bound flags {flagged}"
    else:
        assert "the bound flags none of the controls" in v["why"]


@pytest.mark.parametrize("mutant", [_scaled, _shifted_row, _one_prompt_wrong, _one_nan])
def test_a_mutant_candidate_is_never_passed(base, mutant):
    from benchmarks.e2e.run import report

    corr = _close_record(base)
    corr["runs"]["ours-graphs"] = {"sequential": _run(mutant(base)), "concurrent": _run(base)}
    assert report(corr, None, factor=2.0)["verdict"]["result"] == "FAIL"
    # Outside the bound is a failure whatever the controls show.
    corr["runs"].update(_ladder(base, dict.fromkeys(("L24 1%", "L39 1%", "L24 10%", "L24 50%"), 1)))
    assert report(corr, None, factor=2.0)["verdict"]["result"] == "FAIL"


def test_a_record_without_the_ladder_reports_not_measured(base, tmp_path):
    """A correctness.json with only the concurrent-probed 1% control of an older layout."""
    from benchmarks.e2e.run import CONTROLS, main

    corr = _close_record(base)
    for c in CONTROLS:
        del corr["runs"][c.server]
    corr["runs"]["stock-eager-perturbed"] = {"concurrent": _run(_scaled(base))}
    out = tmp_path
    (out / "correctness.json").write_text(json.dumps(corr))
    assert main(["report", "--out", str(out)]) == 1
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"]["result"] == "NO VERDICT"
    assert "not measured" in rep["verdict"]["why"]
    assert rep["verdict"]["resolving_power"] == "not measured L24 1%, L39 1%, L24 10%, L24 50%"
    assert all(rep["comparisons"][c.comparison] == {"missing": True} for c in CONTROLS)


def test_no_verdict_without_a_flagged_negative_control_or_with_a_missing_run(base):
    from benchmarks.e2e.run import CONTROLS, report

    # A chaotic model: every run is the truth plus its own rounding noise, so every pair of
    # runs, the stock path's variations included, is as far apart as any other.
    noisy = [_run(_noisy(base, 0.5, seed)) for seed in range(8)]
    corr = {
        "runs": {
            "stock-eager": {"sequential": noisy[0], "concurrent": noisy[1]},
            "stock-graphs": {"sequential": noisy[2], "concurrent": noisy[3]},
            "ours-eager": {"sequential": noisy[4], "concurrent": noisy[5]},
            "ours-graphs": {"sequential": noisy[6], "concurrent": noisy[7]},
            # a 1% change hides inside a chaotic model's own variation
            **_ladder(_noisy(base, 0.5, 9), {}),
        }
    }
    rep = report(corr, None, factor=2.0)
    assert rep["verdict"]["result"] == "NO VERDICT"
    assert "the bound flags none of the controls" in rep["verdict"]["why"]
    for c in CONTROLS:
        del corr["runs"][c.server]
    rep = report(corr, None, factor=2.0)
    assert rep["verdict"]["result"] == "NO VERDICT"
    assert "not measured: every negative control" in rep["verdict"]["why"]
    del corr["runs"]["ours-graphs"]
    rep = report(corr, None, factor=2.0)
    assert rep["verdict"]["result"] == "NO VERDICT" and "not measured: [" in rep["verdict"]["why"]


def test_a_candidate_outside_the_bound_fails(base):
    from benchmarks.e2e.run import report

    def same(lps):
        return {"sequential": _run(lps), "concurrent": _run(lps)}

    corr = {
        "runs": {
            "stock-eager": same(base),
            "stock-graphs": same(base),
            "ours-eager": same(_scaled(base)),
            "ours-graphs": same(base),
            **_ladder(base, {}),
        }
    }
    rep = report(corr, None, factor=2.0)
    assert rep["verdict"]["result"] == "FAIL"
    assert "ours vs stock, eager, batch 16" in rep["verdict"]["why"]


def _bound(max_abs: float) -> agreement.Bound:
    return agreement.Bound(max_abs=max_abs, mean_abs=0.01, aggregate_mean_abs=0.01, factor=2.0,
                           sources={})  # fmt: skip


@pytest.mark.parametrize(
    ("margins", "greedy"),
    [
        ({"a": [0.0, 0.0], "b": [0.1, 0.0]}, True),  # a near-tie within the bound
        ({"a": [0.0, 0.0], "b": [0.0, 0.3]}, False),  # one token clearly below its top-1
        ({"a": [0.0, math.nan], "b": [0.0, 0.0]}, False),  # NaN is never within
        ({"a": [0.0], "b": None}, False),  # a prompt without margins
        ({}, False),  # nothing measured
    ],
)
def test_greedy_check_flags_a_token_below_the_top1(margins, greedy):
    prompts_ = {n: ({"greedy_margin": m} if m is not None else {}) for n, m in margins.items()}
    check = agreement.greedy_check(prompts_, _bound(0.25))
    assert check["greedy"] is greedy, check


def _rounded_runs(truth: dict, systematic: float, seed: int, noise: float = 0.02) -> dict:
    """A path's two schedules: the truth moved by the path's own repeatable offset per
    position (sd ``systematic``, the same in both), each schedule with fresh rounding noise
    (sd ``noise``), as bf16 logits re-round whenever anything upstream rounds differently."""
    rng = random.Random(seed)
    offset = {n: [rng.gauss(0, systematic) for _ in v] for n, v in truth.items()}

    def schedule(k):
        r = random.Random(seed * 1000 + k)
        return _run({n: [x + o + r.gauss(0, noise) for x, o in zip(v, offset[n], strict=True)]
                     for n, v in truth.items()})  # fmt: skip

    return {"sequential": schedule(1), "concurrent": schedule(2)}


@pytest.fixture
def long_truth():
    """About 40,000 positions: enough for the pooled covariance to resolve 0.002 nats."""
    rng = random.Random(7)
    return {f"p{i}": [-rng.uniform(0.5, 8.0) for _ in range(2500 + 997 * i)] for i in range(8)}


@pytest.mark.parametrize("systematic", [0.0, 0.004, 0.008, 0.016])
def test_the_systematic_deviation_keeps_what_repeats_and_drops_fresh_rounding(
    long_truth, systematic
):
    x = _rounded_runs(long_truth, systematic, seed=1)
    y = _rounded_runs(long_truth, 0.0, seed=2)
    d = agreement.systematic_deviation(
        x["sequential"], y["sequential"], x["concurrent"], y["concurrent"]
    )
    assert d["positions"] == sum(map(len, long_truth.values()))
    # The noise (0.02 per run) is 1.25-5x the systematic part, which comes back within the
    # covariance's sampling error (about 3.6e-6 nats^2 over these 48,000 positions: 0.0019
    # nats as a root at 0, 0.0005 at 0.004). Taking one schedule's delta twice instead
    # would give about 0.028 whatever the systematic part.
    assert abs(abs(d["rms"]) - systematic) < 0.0025, d
    nan_run = json.loads(json.dumps(x["sequential"]))
    nan_run["prompts"]["p3"]["logprobs"][5] = math.nan
    inf = agreement.systematic_deviation(nan_run, y["sequential"], x["concurrent"], y["concurrent"])
    assert inf["rms"] == math.inf


def _rounded_record(truth: dict, control_systematic: float, ours_systematic: float) -> dict:
    """Stock's variations with their own small repeatable offsets (other kernels), ours, and
    the L24 50% control (the other controls invisible), all drowned in rounding noise."""
    from benchmarks.e2e.run import CONTROLS

    runs = {
        "stock-eager": _rounded_runs(truth, 0.0, 1),
        "stock-graphs": _rounded_runs(truth, 0.002, 2),
        "stock-eager-chunk2048": _rounded_runs(truth, 0.002, 3),
        "ours-eager": _rounded_runs(truth, ours_systematic, 4),
        "ours-graphs": _rounded_runs(truth, ours_systematic, 5),
    }
    for k, c in enumerate(CONTROLS):
        runs[c.server] = _rounded_runs(truth, control_systematic if c.rel == 0.5 else 0.0, 10 + k)
    return {"runs": runs}


def test_a_change_that_rounding_noise_hides_from_every_mean_is_flagged_by_what_repeats(long_truth):
    """As measured on the smoke checkpoint (H100): every position re-rounds, so the 50%
    control's pooled mean |delta| sits within 1.1x of the stock path's; its systematic
    deviation (4x stock's) does not. Ours, as repeatable as stock's own variations, passes."""
    from benchmarks.e2e.run import report

    rep = report(_rounded_record(long_truth, 0.008, 0.002), None, factor=2.0)
    control = rep["comparisons"]["NEGATIVE CONTROL L24 50% attention vs stock (eager, batch 1)"]
    assert control["pooled_within"] and control["outside"] == []  # the means cannot see it
    assert control["systematic_within"] is False and not control["within"]
    assert rep["bound"]["systematic"] == pytest.approx(
        2 * max(v["rms"] for v in rep["bound"]["systematic_sources"].values())
    )
    assert set(rep["bound"]["systematic_sources"]) == {
        "stock eager vs graphs",
        "stock prefill chunk 8192 vs 2048",
    }
    assert rep["verdict"]["result"] == "PASS", rep["verdict"]
    assert rep["verdict"]["resolving_power"] == "flags L24 50%; not L24 1%, L39 1%, L24 10%"
    # Ours with the control's systematic deviation fails, though every mean passes it.
    rep = report(_rounded_record(long_truth, 0.008, 0.008), None, factor=2.0)
    ours = rep["comparisons"]["ours vs stock, CUDA graphs, batch 16"]
    assert ours["pooled_within"] and ours["systematic_within"] is False
    assert rep["verdict"]["result"] == "FAIL"
    # Without the controls' second schedule the systematic deviation is not measured for
    # them, and nothing else flags the control: no verdict.
    corr = _rounded_record(long_truth, 0.008, 0.002)
    for name in list(corr["runs"]):
        if name.startswith("control-"):
            del corr["runs"][name]["concurrent"]
    rep = report(corr, None, factor=2.0)
    control = rep["comparisons"]["NEGATIVE CONTROL L24 50% attention vs stock (eager, batch 1)"]
    assert control["systematic"] is None and control["within"]
    assert rep["verdict"]["result"] == "NO VERDICT"


def test_run_to_run_keeps_what_repeats_between_two_runs_of_one_server(long_truth):
    """Two runs of the same servers: a server whose second run moved repeatably (0.008)
    shows it as its systematic deviation; one that only re-rounded shows about 0; a server
    probed in one schedule is summarized without a systematic figure; a server in one
    record only is left out."""
    from benchmarks.e2e.run import run_to_run

    first = {"runs": {"stock-eager": _rounded_runs(long_truth, 0.0, 1),
                      "stock-graphs": _rounded_runs(long_truth, 0.0, 2),
                      "ours-eager": _rounded_runs(long_truth, 0.0, 3),
                      "only-here": _rounded_runs(long_truth, 0.0, 4)}}  # fmt: skip
    second = {"runs": {"stock-eager": _rounded_runs(long_truth, 0.0, 11),
                       "stock-graphs": _rounded_runs(long_truth, 0.0, 12),
                       "ours-eager": _rounded_runs(long_truth, 0.008, 13)}}  # fmt: skip
    second["runs"]["stock-graphs"].pop("concurrent")
    rows = run_to_run(first, second)
    assert set(rows) == {"stock-eager", "stock-graphs", "ours-eager"}
    assert abs(rows["ours-eager"]["systematic"]["rms"] - 0.008) < 0.0025
    assert abs(rows["stock-eager"]["systematic"]["rms"]) < 0.0025
    assert set(rows["stock-graphs"]) == {"sequential"}
    assert rows["stock-graphs"]["sequential"]["mean_abs"] == pytest.approx(0.0226, rel=0.1)


def test_rerun_refuses_records_of_another_stack(tmp_path, capsys):
    from benchmarks.e2e.run import main

    for name, torch_version in (("a.json", "2.14.0+cu130"), ("b.json", "2.11.0+cu130")):
        rec = {"phase": "correctness", "runs": {}, "servers": {}, "throughput": {},
               "environment": {"gpu": "NVIDIA H100 80GB HBM3", "torch": torch_version,
                               "triton": "3.8.0", "vllm": "0.33.0"}}  # fmt: skip
        (tmp_path / name).write_text(json.dumps(rec))
    with pytest.raises(SystemExit):
        main(["rerun", "--records", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert "'torch' is '2.11.0+cu130'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["rerun", "--records", str(tmp_path / "a.json")])
    assert "the two records" in capsys.readouterr().err
