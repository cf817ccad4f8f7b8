"""The shared benchmark runner: check before timing, no speed-up on a failed check,
gates from measured device limits, results merged per GPU (CPU, fake timer)."""

import json
import os

import pytest
import torch

from benchmarks.runner import (
    Case,
    CheckResult,
    Gate,
    Timing,
    exact_check,
    restored_env,
    run_suite,
)

INFO = {"gpu": "Fake GPU 80GB", "torch": "x", "triton": "y"}


class FakeTimer:
    """Returns the duration each callable reports, so tests control the timings."""

    def __init__(self):
        self.calls = 0

    def __call__(self, fn):
        self.calls += 1
        us = fn()
        return Timing(us, us * 0.9, us * 1.1)


def _case(name, correct, base_us=10.0, cand_us=2.0, nbytes=1_000_000, gates=()):
    return Case(
        suite="s",
        name=name,
        params={},
        setup=lambda: None,
        baseline_name="base",
        baseline=lambda s: base_us,
        candidate_name="cand",
        candidate=lambda s: cand_us,
        check=lambda s, b, c: CheckResult(correct, "ok" if correct else "mismatch"),
        bytes_moved=lambda s: nbytes,
        gates=list(gates),
    )


def test_failed_check_is_not_timed_and_reports_no_speedup(tmp_path):
    timer = FakeTimer()
    report = run_suite(
        "s",
        [_case("bad", False)],
        timer=timer,
        results_dir=tmp_path,
        info=INFO,
        copy_gbs=1000.0,
        launch_us=1.0,
    )
    (row,) = report["cases"]
    assert timer.calls == 0
    assert not row["correct"] and "speedup" not in row and "candidate_us" not in row
    assert row["status"].startswith("correctness-failed")


def test_speedup_bandwidth_and_gates(tmp_path):
    # Median: 1 MB in 2 us = 500 GB/s = 50% of 1000 GB/s; floor = 1 us + 1 us = 2 us ->
    # ratio 1; speed-up 10 / 2 = 5. Gates are judged at the candidate's p80 (2.2 us with
    # this timer): 45.5% of copy, floor ratio 1.1, speed-up 10 / 2.2 = 4.55.
    gates = [
        Gate("bandwidth_fraction_min", 0.7),
        Gate("floor_ratio_max", 3.0),
        Gate("speedup_min", 4.5),
        Gate("speedup_min", 5.0),  # met at the median, missed at p80
        Gate("bandwidth_fraction_min", 0.5),  # likewise
        Gate("floor_ratio_max", 1.05),  # likewise
    ]
    report = run_suite(
        "s",
        [_case("good", True, gates=gates)],
        timer=FakeTimer(),
        results_dir=tmp_path,
        info=INFO,
        copy_gbs=1000.0,
        launch_us=1.0,
    )
    (row,) = report["cases"]
    assert row["speedup"] == 5.0
    assert abs(row["candidate_gbs"] - 500.0) < 1e-9
    assert abs(row["floor_ratio"] - 1.0) < 1e-9
    assert [g["passed"] for g in row["gates"]] == [False, True, True, False, False, False]
    assert all(g["at"] == "candidate p80" for g in row["gates"])
    speedups = [g for g in row["gates"] if g["kind"] == "speedup_min"]
    assert [round(g["value"], 4) for g in speedups] == [4.5455, 4.5455]
    assert [g["value_at_median"] for g in speedups] == [5.0, 5.0]
    bandwidth = row["gates"][4]
    assert bandwidth["value"] == pytest.approx(1 / 2.2) and bandwidth["value_at_median"] == 0.5
    assert row["gates"][5]["value"] == pytest.approx(1.1)


def test_results_are_merged_per_gpu_and_in_summary(tmp_path):
    for suite in ("a", "b"):
        case = _case("c", True)
        case.suite = suite
        run_suite(
            suite,
            [case],
            timer=FakeTimer(),
            results_dir=tmp_path,
            info=INFO,
            copy_gbs=1000.0,
            launch_us=1.0,
        )
    per_gpu = json.loads((tmp_path / "Fake_GPU_80GB.json").read_text())
    assert set(per_gpu["suites"]) == {"a", "b"}
    summary = json.loads((tmp_path / "sm80_benchmark_summary.json").read_text())
    assert set(summary) == {"Fake_GPU_80GB"}
    assert summary["Fake_GPU_80GB"]["suites"]["b"]["label"].startswith("Fake GPU 80GB")


def test_exact_check_detects_one_flipped_bit_and_matches_nan():
    a = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.bfloat16)
    b = a.clone()
    assert exact_check(a, b).ok
    b.view(torch.int16)[2] ^= 1
    assert not exact_check(a, b).ok
    assert not exact_check(torch.arange(3), torch.arange(3) + 1).ok


def test_restored_env_puts_back_a_set_or_an_unset_variable(monkeypatch):
    """The engine comparisons switch engine variables per run: whatever the block sets, a
    variable that was set comes back with its value, one that was unset comes back unset,
    also when the block raises."""

    monkeypatch.setenv("DEEPINFER_TEST_ENGINE", "triton")
    with restored_env("DEEPINFER_TEST_ENGINE"):
        os.environ["DEEPINFER_TEST_ENGINE"] = "tilelang"
    assert os.environ["DEEPINFER_TEST_ENGINE"] == "triton"
    monkeypatch.delenv("DEEPINFER_TEST_ENGINE")
    with pytest.raises(RuntimeError), restored_env("DEEPINFER_TEST_ENGINE"):
        os.environ["DEEPINFER_TEST_ENGINE"] = "tilelang"
        raise RuntimeError("a failed run")
    assert "DEEPINFER_TEST_ENGINE" not in os.environ
