"""benchmarks/mhc_tune_small: the shapes it sweeps are ones the small kernel accepts,
and they include the shipped shape (the timing itself needs a GPU)."""

from benchmarks.mhc_tune_small import THREADS, shapes_for
from deepinfer_sm80.ops.mhc.geometry import TC_MIN_TOKENS, slice_width, small_config


def test_sweep_covers_the_shipped_shape_and_only_buildable_ones():
    assert slice_width(5120) // 4 == THREADS
    for t in range(1, TC_MIN_TOKENS):
        shapes = list(shapes_for(t))
        shipped = small_config(t)
        assert (shipped.token_group, shipped.tile_n) in shapes, t
        for group, tile in shapes:
            assert group < 2 * t and 24 % tile == 0
            assert group * (tile + 2) <= THREADS
    assert (3, 2) in shapes_for(12) and (6, 1) not in shapes_for(3)
    assert list(shapes_for(12, groups=(3,), tiles=(2, 4))) == [(3, 2), (3, 4)]
