"""The indexer microbenchmark imports and lists its cases on a CPU machine (no CUDA)."""

import torch

from benchmarks import microbench_sm80_indexer as bench


def test_case_list_builds_without_a_gpu():
    cuda_before = torch.cuda.is_initialized()  # other GPU-tier tests may have started it
    cases = bench.build_registry().cases(bench.SUITE)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) >= 10
    assert any(n.startswith("prefill_") for n in names) and any(
        n.startswith("decode_") for n in names
    )
    # The full 1M context (ratio 1) and 512K (ratio 2) are covered.
    assert {"decode_b1_ctx1048576_r1", "decode_b1_ctx524288_r2"} <= set(names)
    for case in cases:
        assert case.suite == bench.SUITE and case.bytes_moved and case.flops
        assert "vLLM" in case.baseline_name  # baseline = vLLM's reference algorithm
    assert torch.cuda.is_initialized() == cuda_before, "building the cases touched CUDA"
