"""The decode-engine comparison covers every decode case with valid TileLang splits."""

from benchmarks import compare_decode_engines as cmp
from benchmarks.microbench_sm80_kernels import build_registry
from deepinfer_sm80.ops.sparse_mla.tilelang_decode import DecodeVariant


def test_variants_are_buildable_and_cover_both_engines():
    assert {engine for engine, _ in cmp.VARIANTS} == {"triton", "tilelang"}
    for engine, rows in cmp.VARIANTS:
        if engine == "tilelang":
            DecodeVariant(128, 512, True, True, rows)  # raises on a split size it cannot run
    names = [c.name for c in build_registry().cases() if c.name.startswith("mla_decode")]
    assert len(names) == 17 and "mla_decode_T256_H8_w128+512" in names
