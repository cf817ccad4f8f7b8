"""The decode-engine comparison covers every decode case with valid TileLang splits, and
its --variants parser refuses what it cannot run."""

import pytest

from benchmarks import sparse_mla_compare_decode_engines as cmp
from benchmarks.microbench_sparse_mla import build_registry
from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import AttentionVariant


def test_default_variants_are_buildable_and_cover_both_engines():
    parsed = [cmp.parse_variant(text) for text in cmp.DEFAULT_VARIANTS]
    assert {engine for engine, _ in parsed} == {"triton", "tilelang"}
    for engine, overrides in parsed:
        if engine == "tilelang":
            # raises on a split size it cannot run
            AttentionVariant(128, 512, True, True, overrides["ROWS_PER_SPLIT"])
    names = [c.name for c in build_registry().cases() if c.name.startswith("mla_decode")]
    assert len(names) == 32 and "mla_decode_T256_H8_w128+512" in names
    assert "mla_decode_T256_H8_w128+512_throughput" in names
    # the comparison sweeps split sizes: the throughput cases, whose size is fixed, stay out
    compared = [c.name for c in cmp.decode_cases()]
    assert len(compared) == 17 and not any(n.endswith("_throughput") for n in compared)
    assert [c.name for c in cmp.decode_cases("T256_H8")] == ["mla_decode_T256_H8_w128+512"]


def test_variant_parser():
    assert cmp.parse_variant("tilelang:ROWS_PER_SPLIT=256,PREFETCH=2") == (
        "tilelang",
        {"ROWS_PER_SPLIT": 256, "PREFETCH": 2},
    )
    assert cmp.parse_variant("triton") == ("triton", {})
    with pytest.raises(ValueError, match="engine must be triton or tilelang"):
        cmp.parse_variant("cuda")
    with pytest.raises(ValueError, match="TileLang kernel only"):
        cmp.parse_variant("triton:PREFETCH=2")
    with pytest.raises(ValueError, match="NAME=integer with NAME one of"):
        cmp.parse_variant("tilelang:STAGES=3")
    with pytest.raises(ValueError, match="NAME=integer"):
        cmp.parse_variant("tilelang:PREFETCH=two")


def test_variants_over_the_ampere_shared_memory_budget_are_labelled():
    variants = [
        (t, *cmp.parse_variant(t))
        for t in (
            "triton",
            "tilelang:ROWS_PER_SPLIT=192",
            "tilelang:ROWS_PER_SPLIT=320",
            "tilelang:ROWS_PER_SPLIT=640",
        )
    ]
    notes = cmp.ampere_fit_notes(variants)
    # 192, 320 and 640 fit both kernels (narrow at 320: 49,032 of 49,152 B; at 640 its
    # register path for PV: 40,176 B; wide at 640: 47,376 B); 1024 only the narrow one
    assert notes == []
    notes = cmp.ampere_fit_notes([("t", *cmp.parse_variant("tilelang:ROWS_PER_SPLIT=1024"))])
    assert notes == [
        "# t: shared memory wide 59328 B > 49152 B per CTA (Ampere budget): runs here, cannot ship"
    ]
