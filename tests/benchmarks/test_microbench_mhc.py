"""The mHC microbenchmark (suite mhc) lists its cases, checks outputs and judges its
targets on a CPU machine (no CUDA, no kernel launch)."""

import torch

from benchmarks import microbench_mhc as bench
from deepinfer_sm80.ops.mhc.inputs import NORM_EPS, model_like_inputs
from deepinfer_sm80.ops.mhc.ref import fused_post_pre_delayed_ref


def test_case_list_builds_without_a_gpu():
    cuda_before = torch.cuda.is_initialized()  # other GPU-tier tests may have started it
    cases = bench.build_registry().cases(bench.SUITE)
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    assert {"fused_T6", "fused_T12", "fused_T1024", "fused_T12_vs_torch"} <= set(names)
    targets = {c.name: c.params.get("target_speedup") for c in cases}
    assert targets["fused_T12"] == 2.5 and targets["fused_T6"] == 1.3
    assert targets["fused_T12_vs_torch"] is None
    for case in cases:
        assert case.bytes_moved(None) > 100 * 1024 * case.params["T"]
    assert torch.cuda.is_initialized() == cuda_before, "building the cases touched CUDA"


def test_outputs_check_passes_equal_and_catches_a_wrong_coefficient():
    inp = model_like_inputs(3, seed=2)
    ref = fused_post_pre_delayed_ref(
        *inp.positional(), pre_mix=inp.pre_mix, norm_weight=inp.norm_weight, norm_eps=NORM_EPS
    )[:5]
    assert bench.outputs_agree(ref, ref).ok
    bad = list(ref)
    bad[2] = bad[2].clone()
    bad[2][1, 2, 3] += 3e-3
    assert not bench.outputs_agree(ref, tuple(bad)).ok
    bad = list(ref)
    bad[3] = bad[3] * 1.05
    assert not bench.outputs_agree(ref, tuple(bad)).ok


def _timed(case, target, base_median, cand_median, cand_p80):
    return {
        "case": case,
        "params": {"target_speedup": target} if target else {},
        "speedup": base_median / cand_median,
        "baseline_us": {"median": base_median, "p20": base_median, "p80": base_median},
        "candidate_us": {"median": cand_median, "p20": cand_median, "p80": cand_p80},
    }


def test_targets_are_judged_at_the_candidates_p80():
    report = {
        "cases": [
            _timed("fused_T12", 2.5, 27.0, 10.0, 10.5),  # 2.70x median, 2.57x p80
            _timed("fused_T12b", 2.5, 26.0, 10.0, 10.8),  # 2.60x median, 2.41x p80
            _timed("fused_T6", 1.3, 11.0, 10.0, 10.0),
            {"case": "fused_T6x", "params": {"target_speedup": 1.3}},  # not timed
            _timed("fused_T64", None, 9.0, 10.0, 10.0),
        ]
    }
    lines = bench.judge_targets(report)
    assert lines == [
        "fused_T12: 2.57x at p80 (2.70x at the median) vs target 2.5x: PASS",
        "fused_T12b: 2.41x at p80 (2.60x at the median) vs target 2.5x: MISS",
        "fused_T6: 1.10x at p80 (1.10x at the median) vs target 1.3x: MISS",
        "fused_T6x: n/a vs target 1.3x: MISS",
    ]
