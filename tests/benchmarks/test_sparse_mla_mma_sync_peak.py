"""benchmarks.sparse_mla_mma_sync_peak: its FLOP count and its refusal without a GPU (the timing
itself needs a CUDA GPU: run on the device, log in benchmarks/results)."""

import pytest

from benchmarks import sparse_mla_mma_sync_peak as peak


def test_flops_count_every_warps_mmas():
    # one m16n8k16 is 16 x 8 x 16 multiply-adds
    assert peak.MMA_FLOPS == 4096
    # 132 SMs x 2 CTAs x 8 warps x 4 chains x 10 steps
    assert peak.flops(132, 2, 256, 4, steps=10) == 132 * 2 * 8 * 4 * 10 * 4096
    one_warp_group = peak.flops(132, 2, 256, 1, steps=1)
    assert peak.flops(132, 2, 512, 1, steps=1) == 2 * one_warp_group


def test_source_holds_the_called_template():
    source = peak.SOURCE_FILE.read_text()
    assert "namespace mma_sync_peak" in source and "void run(float* out, uint32_t seed)" in source
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in source


def test_refuses_without_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        peak.main([])
