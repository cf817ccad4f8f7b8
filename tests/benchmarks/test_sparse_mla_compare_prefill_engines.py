"""benchmarks.sparse_mla_compare_prefill_engines: covers every head count per rank and refuses to
run without a GPU (the timing needs one: run on the device, log in benchmarks/results)."""

import pytest

from benchmarks import sparse_mla_compare_prefill_engines as cmp


def test_every_head_count_per_rank_and_the_suite_shape():
    assert cmp.HEADS == (8, 16, 32, 64)  # TP 8, 4, 2, 1
    assert (cmp.TOKENS, cmp.WIDTH) == (1024, 640)  # the sparse_mla suite's prefill cases


def test_refuses_without_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        cmp.main([])
