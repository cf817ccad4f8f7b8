"""benchmarks.movmatrix_vs_ldmatrix: its builds compile for sm_80 and sm_86 and fit them
(nvcc and ptxas on the CPU), its counts, and its refusal without a GPU (the timing itself
needs a CUDA GPU)."""

import pytest

from benchmarks import movmatrix_vs_ldmatrix as mvl


def test_fragment_count_and_shared_memory():
    v = mvl.FragmentVariant("ldmatrix", 4, 256, ctas=264, steps=10)
    assert mvl.fragments(v) == 264 * 8 * 4 * 10
    # 8 warps x 4 chains x one padded 16 x 24 bf16 tile
    assert v.smem_bytes() == 8 * 4 * 768
    labels = {mvl.FragmentVariant(m, c).label for m in mvl.MODES for c in mvl.CHAINS}
    assert len(labels) == len(mvl.MODES) * len(mvl.CHAINS)


@pytest.mark.aot
def test_every_build_compiles_and_fits_ampere():
    """Each mode keeps its instructions (movmatrix, ldmatrix.trans, one mma per fragment)
    and fits both architectures without spills."""
    from deepinfer_sm80 import tilelang_build
    from deepinfer_sm80.ampere_fit import fit_violations, format_reports

    variants = [mvl.FragmentVariant(m, 4, 256, ctas=2, steps=8) for m in mvl.MODES]
    reports = tilelang_build.fit_reports(variants, (80, 86))
    print(format_reports(reports))
    assert len(reports) == 6 and fit_violations(reports) == []
    sources = {
        v.mode: tilelang_build.get_kernel(v, tilelang_build.cuda_target(80)).get_kernel_source()
        for v in variants
    }
    assert "movmatrix_vs_ldmatrix::run<1, 4, 8>" in sources["movmatrix"]
    assert "movmatrix_vs_ldmatrix::run<2, 4, 8>" in sources["ldmatrix"]
    assert "movmatrix_vs_ldmatrix::run<0, 4, 8>" in sources["mma only"]


def test_refuses_without_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        mvl.main([])
