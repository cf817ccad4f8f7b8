"""benchmarks.sparse_mla_movmatrix_vs_ldmatrix: its builds compile for sm_80 and sm_86 and fit them
(nvcc and ptxas on the CPU), its counts, and its refusal without a GPU (the timing itself
needs a CUDA GPU)."""

import pytest

from benchmarks import sparse_mla_movmatrix_vs_ldmatrix as mvl


def test_fragment_count_and_shared_memory():
    v = mvl.FragmentVariant("ldmatrix", 4, 256, ctas=264, steps=10)
    assert mvl.fragments(v) == 264 * 8 * 4 * 10
    # 8 warps x 4 chains x one padded 16 x 24 bf16 tile
    assert v.smem_bytes() == 8 * 4 * 768
    labels = {mvl.FragmentVariant(m, c).label for m in mvl.MODES for c in mvl.CHAINS}
    assert len(labels) == len(mvl.MODES) * len(mvl.CHAINS)


@pytest.mark.aot
def test_every_build_fits_ampere_and_keeps_its_instructions(tmp_path):
    """Each mode fits both architectures without spills, and its sm_80 SASS holds what it
    claims to time: one HMMA per fragment in every mode, plus four MOVM per fragment
    (movmatrix) or one LDSM.MT88.4 (ldmatrix), and neither in the MMA-only floor."""
    import subprocess

    from deepinfer_sm80 import tilelang_build
    from deepinfer_sm80.ampere_fit import fit_violations, format_reports
    from tools.cubin_inventory import find_cuobjdump

    chains, steps = 4, 8
    variants = [mvl.FragmentVariant(m, chains, 256, ctas=2, steps=steps) for m in mvl.MODES]
    reports = tilelang_build.fit_reports(variants, (80, 86))
    print(format_reports(reports))
    assert len(reports) == 6 and fit_violations(reports) == []
    counts = {}
    for v in variants:
        source = tilelang_build.get_kernel(v, tilelang_build.cuda_target(80)).get_kernel_source()
        cubin = tmp_path / f"{v.mode.replace(' ', '_')}.cubin"
        tilelang_build.ptxas_verbose(source, 80, [], cubin_out=cubin)
        sass = subprocess.run(
            [str(find_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
        counts[v.mode] = {op: sass.count(op) for op in ("HMMA.16816", "MOVM", "LDSM.16.MT88.4")}
    print(counts)
    # However far ptxas unrolls the step loop, the mix per fragment is fixed.
    for mode, c in counts.items():
        assert c["HMMA.16816"] > 0 and c["HMMA.16816"] % chains == 0, (mode, c)
    mov, ld = counts["movmatrix"], counts["ldmatrix"]
    assert mov["MOVM"] == 4 * mov["HMMA.16816"] and mov["LDSM.16.MT88.4"] == 0
    assert ld["LDSM.16.MT88.4"] == ld["HMMA.16816"] and ld["MOVM"] == 0
    assert counts["mma only"]["MOVM"] == counts["mma only"]["LDSM.16.MT88.4"] == 0


def test_refuses_without_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        mvl.main([])
