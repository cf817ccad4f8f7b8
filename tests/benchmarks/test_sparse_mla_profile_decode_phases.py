"""benchmarks.sparse_mla_profile_decode_phases: its marks still land in the shipped narrow kernel,
it refuses a kernel that moved under its anchors, and its phase arithmetic (the timing
needs a CUDA GPU: run on the device, log in benchmarks/results)."""

import numpy as np
import pytest

from benchmarks import sparse_mla_profile_decode_phases as prof
from deepinfer_sm80.ops.sparse_mla import tilelang_kernels


def test_marks_land_once_each_in_the_narrow_kernel_only():
    source = tilelang_kernels.SOURCE_FILE.read_text()
    patched = prof.instrumented_source(source)
    narrow = patched.index("void attention_cta_narrow(")
    for k in range(6):
        call = prof._MARK.format(k=k)
        assert patched.count(call) == 1, k
        assert patched.index(call) > narrow  # the wide kernel is left as it is
    # the last mark follows the merge, after a barrier
    last_mark = "__syncthreads();\n  prof_mark(lse_ptr, t, lse_stride_t, split, 5);\n}\n"
    assert patched.rstrip().endswith(last_mark + "\n}  // namespace deepinfer_mla")
    # nothing else changed: removing the insertions gives the source back
    assert len(patched) > len(source)
    assert patched.replace(prof._HELPER, "").count("\n") - source.count("\n") == 7
    # 8 real heads + 4 splits x 11 words fit the 64 padded lse columns
    assert prof.FIRST_COLUMN + prof.MAX_SPLITS * prof.WORDS_PER_SPLIT <= 64


def test_refuses_a_kernel_that_moved_under_an_anchor():
    source = tilelang_kernels.SOURCE_FILE.read_text()
    moved = source.replace("// sm.scale and sm.field are complete", "// tables complete")
    with pytest.raises(ValueError, match="anchor 'tables ready' occurs 0 times"):
        prof.instrumented_source(moved)
    with pytest.raises(ValueError, match="attention_cta_narrow not found"):
        prof.instrumented_source("// no kernel here\n")


def test_phases_from_clock_words():
    # one token, 4 splits; clocks at 1 GHz -> 1000 cycles per us; one clock wraps 2^32
    words = np.zeros((1, 4, 11), dtype=np.int64)
    base = [0, 2**32 - 500, 10, 20]
    for s in range(4):
        b = base[s]
        marks = [b, b + 2000, b + 3000, b + 9000, b + 9500, b + 10_000 + 1000 * s]
        words[0, s, :6] = [m % 2**32 for m in marks]
    ph = prof.phases(words, ghz=1.0)
    assert np.allclose(ph["prologue"], 2.0) and np.allclose(ph["first tile"], 1.0)
    assert np.allclose(ph["loop"], 7.0) and np.allclose(ph["epilogue"], 0.5)
    assert np.allclose(ph["arrival"][0], [0.5, 1.5, 2.5, 3.5])
    assert ph["merged"][0].tolist() == [False, False, False, True]
    assert np.allclose(ph["total"][0], [10, 11, 12, 13])
