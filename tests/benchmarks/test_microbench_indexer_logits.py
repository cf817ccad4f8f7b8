"""The indexer microbenchmark imports and lists its cases on a CPU machine (no CUDA)."""

import pytest
import torch

from benchmarks import microbench_indexer_logits as bench


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


def _smallest_decode_case():
    cases = [c for c in bench.build_registry().cases(bench.SUITE) if c.name.startswith("decode_")]
    return min(cases, key=lambda c: sum(c.params["lens"]))


class _DeviceLengths:
    """Stands in for the device copy of the lengths: the baseline must not touch it."""

    def __getattr__(self, name):
        raise AssertionError(f"the baseline used the device lengths (.{name})")


def test_decode_baseline_takes_its_lengths_from_the_host(monkeypatch):
    """The baseline's loop needs host integers; it gets them from a host tensor built in
    setup, so no device-to-host copy (a sync) falls inside its timed region."""
    seen = {}

    def loop(q, cache, w, context_lens, table, width):
        seen["device"] = context_lens.device.type
        return "logits"

    monkeypatch.setattr(bench, "paged_mqa_logits_torch_loop", loop)
    case = _smallest_decode_case()
    q = torch.zeros(1, 1, bench.HEADS, bench.HEAD_DIM)
    table = torch.zeros(1, 1, dtype=torch.int32)
    host = torch.tensor(case.params["lens"], dtype=torch.int32)
    assert case.baseline((None, table, q, None, _DeviceLengths(), host)) == "logits"
    assert seen == {"device": "cpu"}


@pytest.mark.gpu
def test_decode_baseline_never_syncs_with_the_host():
    """On the GPU: the timed baseline call runs under CUDA's sync debug mode set to error."""
    case = _smallest_decode_case()
    state = case.setup()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        case.baseline(state)
    finally:
        torch.cuda.set_sync_debug_mode("default")
