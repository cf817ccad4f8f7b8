"""benchmarks.sparse_mla_ab_head_tiles on CPU: its arguments and cases, its roofline terms,
the agreement gate that withholds a time (it must reject a scaled output, a wrong row
and a shifted lse), the HEAD_TILES switch reaching launch() and the kernel TileLang
generates (lowered for sm_80, not compiled): one CTA per 32 heads, opt-in shared memory
past 48 KB, launch bounds for one CTA per SM. The timing itself needs a CUDA GPU."""

import pytest
import torch

from benchmarks import sparse_mla_ab_head_tiles as ab
from deepinfer_sm80.ops.sparse_mla import tilelang_kernels
from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import AttentionVariant
from tests.benchmarks import decode_launches


def test_arguments_and_case_list():
    args = ab.parse_args(["--out", "x.json"])
    cases = ab.cases(args)
    assert (args.reps, args.tiles) == (50, 4)
    assert len(cases) == 30 and len(set(cases)) == 30
    assert {c.heads for c in cases} == {16, 32, 64} and {c.T for c in cases} == {1, 4, 16, 64, 256}
    assert cases[0].name == "H16_T1_latency"
    for bad in (
        [],
        ["--out", "x", "--reps", "49"],
        ["--out", "x", "--heads", "8"],  # the narrow kernel either way
        ["--out", "x", "--heads", "65"],
        ["--out", "x", "--tiles", "3"],
    ):
        with pytest.raises(SystemExit):
            ab.parse_args(bad)


def test_roofline_terms():
    case = ab.RooflineCase(64, 256, "throughput")
    assert case.bytes_moved() == 256 * (640 * 584 + 64 * 512 * 4)
    assert case.flops() == 256 * 64 * 640 * 512 * 4


def _pair(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(4, 32, 512, generator=g).bfloat16()
    lse = torch.randn(4, 32, generator=g) + 5
    return out, lse


@pytest.mark.parametrize(
    "mutant",
    [
        lambda o, lse: (o * (1 + 2**-5), lse),  # scaled by 3%
        lambda o, lse: (o.roll(1, dims=0), lse),  # another token's row
        lambda o, lse: (o, lse + 2e-3),  # lse shifted
        lambda o, lse: (torch.where(o == o.max(), float("nan"), o.float()).bfloat16(), lse),
    ],
    ids=["scaled", "wrong-row", "lse-shift", "nan"],
)
def test_agreement_gate_rejects_mutants(mutant):
    out, lse = _pair()
    assert ab.agreement((out, lse), (out.clone(), lse.clone()))["agree"]
    assert not ab.agreement((out, lse), mutant(out.clone(), lse.clone()))["agree"]


def test_head_tiles_switch_reaches_launch(monkeypatch):
    built = decode_launches.record_variants(monkeypatch)
    for tiles in (1, 4):
        with ab.head_tiles(tiles):
            for heads in (8, 16, 64):
                decode_launches.launch(heads)
    assert [(v.narrow, v.head_tiles, v.heads_per_cta) for v in built] == [
        (True, 1, 8), (False, 1, 16), (False, 1, 16),
        (True, 1, 8), (True, 2, 16), (True, 4, 32),
    ]  # fmt: skip
    # head_tiles leaves the shipped config as it found it: the wide kernel above 8 heads
    assert tilelang_kernels.decode_kernel_shape(64) == (False, 1)


def test_generated_kernel_for_32_heads_per_cta():
    variant = AttentionVariant(128, 512, True, True, 192, 1, True, head_tiles=4)
    launch, source = decode_launches.lowered(variant)
    # grid (tokens, ceil(heads / 32), 4 splits), block 256, 56,408 B of shared memory
    assert launch.endswith(", num_tokens, (num_heads + 31) // 32, 4, 256, 1, 1, 56408)")
    assert source.count(variant.callee() + "(") == 1
    assert "__launch_bounds__(256, 1)" in source


def test_a_knob_the_config_lacks_is_refused():
    from benchmarks.sparse_mla_decode_config import decode_constexpr

    with (
        pytest.raises(KeyError, match="no constexpr 'HEAD_TILE'"),
        decode_constexpr("HEAD_TILE", 4),
    ):
        pass


def _launched_as_a_then_b(monkeypatch, candidate: str, tiles: int) -> list:
    """The variants launch() builds for 8 and then 64 heads, under A's config and then B's."""
    built = decode_launches.record_variants(monkeypatch)
    for b in (False, True):
        with ab.candidate_config(candidate, tiles, b):
            for heads in (8, 64):
                decode_launches.launch(heads)
    return built


def test_qk_registers_candidate_reaches_launch_and_only_the_callee_changes(monkeypatch):
    """--candidate qk-registers: A is the shipped wide kernel, B the same kernel with
    QK_REGISTERS 1 (8 heads run the narrow kernel either way); TileLang's generated code
    differs only in the callee's last template argument."""
    args = ab.parse_args(["--out", "x.json", "--candidate", "qk-registers"])
    assert args.candidate == "qk-registers"
    with pytest.raises(SystemExit):
        ab.parse_args(["--out", "x", "--candidate", "faster"])
    built = _launched_as_a_then_b(monkeypatch, "qk-registers", args.tiles)
    assert [(v.narrow, v.qk_registers) for v in built] == [
        (True, False), (False, False), (True, False), (False, True),
    ]  # fmt: skip
    assert not any(v.qk_registers for v in tilelang_kernels.shipped_variants())
    assert "QK_REGISTERS 1" in ab.candidate_name("qk-registers", 4)
    off = AttentionVariant(128, 512, True, True, 192, 1, False)
    on = AttentionVariant(128, 512, True, True, 192, 1, False, qk_registers=True)
    off_launch, off_source = decode_launches.lowered(off)
    on_launch, on_source = decode_launches.lowered(on)
    assert on_launch == off_launch
    assert on_source == off_source.replace(off.callee() + "(", on.callee() + "(")


def test_ctas_candidate_reaches_launch_and_only_the_launch_bounds_change(monkeypatch):
    """--candidate ctas-3: A is the shipped wide kernel (2 CTAs per SM), B the same kernel
    built for 3 (8 heads run the narrow kernel either way); TileLang's generated code
    differs only in __launch_bounds__'s minimum."""
    args = ab.parse_args(["--out", "x.json", "--candidate", "ctas-3"])
    built = _launched_as_a_then_b(monkeypatch, "ctas-3", args.tiles)
    assert [(v.narrow, v.ctas_per_sm) for v in built] == [
        (True, 2), (False, 2), (True, 2), (False, 3),
    ]  # fmt: skip
    assert {v.ctas_per_sm for v in tilelang_kernels.shipped_variants()} == {2}
    assert "CTAS_PER_SM 3" in ab.candidate_name("ctas-3", 4)
    assert ab._b_label({"candidate": "ctas-3"}) == "3 CTAs/SM"
    two = AttentionVariant(128, 512, True, True, 192, 1, False)
    three = AttentionVariant(128, 512, True, True, 192, 1, False, ctas_per_sm=3)
    two_launch, two_source = decode_launches.lowered(two)
    three_launch, three_source = decode_launches.lowered(three)
    assert three_launch == two_launch
    assert "__launch_bounds__(256, 2)" in two_source
    bounds = "__launch_bounds__(256, {})"
    assert three_source == two_source.replace(bounds.format(2), bounds.format(3))
