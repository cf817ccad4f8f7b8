"""The o_proj microbenchmark imports and lists its cases on a CPU machine (no CUDA), and
its smallest case's check passes when run on CPU (kernel under the interpreter)."""

import torch

from benchmarks import microbench_inv_rope as bench


def test_case_list_builds_without_a_gpu():
    cuda_before = torch.cuda.is_initialized()  # other GPU-tier tests may have started it
    cases = bench.build_registry().cases(bench.SUITE)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) >= 20
    assert {"inv_rope_tp1_T1", "o_proj_a_tp1_T16384", "o_proj_a_tp2_T4096"} <= set(names)
    for case in cases:
        assert case.suite == bench.SUITE and case.bytes_moved
        assert "vLLM" in case.baseline_name
        assert case.params["heads"] * case.params["tp"] == 64
        if case.name.startswith("o_proj_a"):
            assert case.flops
    assert torch.cuda.is_initialized() == cuda_before, "building the cases touched CUDA"


def test_smallest_cases_check(device):
    """Candidate and baseline agree as the runner checks them (before any timing);
    a corrupted candidate is caught. On the test device: the interpreter on CPU, or the
    GPU under `make test-gpu`."""
    registry = bench.build_registry(device=str(device))
    for name in ("inv_rope_tp1_T1", "o_proj_a_tp2_T1"):
        (case,) = [c for c in registry.cases(bench.SUITE) if c.name == name]
        state = case.setup()
        cand, base = case.candidate(state), case.baseline(state)
        result = case.check(state, base, cand)
        assert result.ok, result.detail
    rotated = cand[0].clone()
    rotated[0, 0, -1] += 1.0
    assert not case.check(state, base, (rotated, cand[1])).ok
