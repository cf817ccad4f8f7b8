"""benchmarks.sparse_mla_ab_grid_order on CPU: its arguments and case list, and the grid-order
flag (arch.py SPLITS_FASTEST) it switches: part of the kernel's key and label, picked up
by launch() and warmup, and changing TileLang's generated code (lowered for sm_80, not
compiled) only when on: the launch grid and the callee's last template argument. The
timing itself needs a CUDA GPU."""

import pytest

from benchmarks import sparse_mla_ab_grid_order as ab
from deepinfer_sm80.ops.sparse_mla import tilelang_kernels
from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import AttentionVariant
from tests.benchmarks import decode_launches


def test_arguments_and_case_list():
    args = ab.parse_args(["--out", "x.json"])
    cases = ab.cases(args)
    assert args.reps == 50 and str(args.out) == "x.json"
    assert len(cases) == 18 and len(set(cases)) == 18
    assert {c.heads for c in cases} == {8, 32, 64} and {c.T for c in cases} == {16, 64, 256}
    assert {c.splits for c in cases} == {"latency", "throughput"}
    assert cases[0].name == "H8_T16_latency"
    # 2 orders x (wide, narrow) x (192-row, 640-row splits): 8 TileLang builds
    assert ab.kernel_builds(cases) == 8
    small = ab.cases(ab.parse_args(["--out", "y", "--heads", "8", "--tokens", "4", "--reps", "60"]))
    assert [c.name for c in small] == ["H8_T4_latency", "H8_T4_throughput"]
    assert ab.kernel_builds(small) == 4
    for bad in ([], ["--out", "x", "--reps", "49"], ["--out", "x", "--splits", "fast"]):
        with pytest.raises(SystemExit):
            ab.parse_args(bad)
    with pytest.raises(SystemExit):
        ab.parse_args(["--out", "x", "--heads", "65"])


def _variant(narrow: bool, on: bool) -> AttentionVariant:
    return AttentionVariant(128, 512, True, True, 192, 1, narrow, splits_fastest=on)


@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
def test_flag_is_part_of_the_kernel_key_and_name(narrow):
    off, on = _variant(narrow, False), _variant(narrow, True)
    assert off == AttentionVariant(128, 512, True, True, 192, 1, narrow)  # off by default
    assert off != on and hash(off) != hash(on)
    assert on.label == off.label[:-1] + ",splits-fastest]" and "splits" not in off.label
    assert on.callee() == off.callee()[:-1] + ", true>"
    assert (on.smem_bytes(), on.max_splits) == (off.smem_bytes(), off.max_splits)


def test_config_flag_reaches_warmup_and_launch(monkeypatch):
    built = decode_launches.record_variants(monkeypatch)
    for on in (False, True):
        with ab.grid_order(on):
            decode = [v for v in tilelang_kernels.shipped_variants() if not v.bf16_rows]
            prefill = [v for v in tilelang_kernels.shipped_variants() if v.bf16_rows]
            assert decode and all(v.splits_fastest == on for v in decode)
            assert prefill and not any(v.splits_fastest for v in prefill)
            for heads in (8, 64):
                decode_launches.launch(heads)
    assert [(v.narrow, v.splits_fastest) for v in built] == [
        (True, False),
        (False, False),
        (True, True),
        (False, True),
    ]
    # grid_order leaves the shipped config as it found it: off
    assert not any(v.splits_fastest for v in tilelang_kernels.shipped_variants())


@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
def test_generated_code_changes_only_when_on(narrow):
    per_cta = 8 if narrow else 16
    off_launch, off_source = decode_launches.lowered(_variant(narrow, False))
    on_launch, on_source = decode_launches.lowered(_variant(narrow, True))
    smem = _variant(narrow, False).smem_bytes()
    blocks = f"(num_heads + {per_cta - 1}) // {per_cta}"
    # grid (tokens, head blocks, 4 splits), then the block (256, 1, 1) and shared memory
    assert off_launch.endswith(f", num_tokens, {blocks}, 4, 256, 1, 1, {smem})")
    # one dimension: tokens x head blocks x splits (tokens never in y or z)
    assert on_launch.endswith(f", num_tokens * ({blocks}) * 4, 256, 1, 1, {smem})")
    off, on = _variant(narrow, False), _variant(narrow, True)
    assert off_source.count(off.callee() + "(") == 1
    assert on_source == off_source.replace(off.callee() + "(", on.callee() + "(")


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    """Both A/B decode benchmarks start through sparse_mla_decode_config.start_ab_run."""
    from benchmarks import sparse_mla_ab_head_tiles

    for bench in (ab, sparse_mla_ab_head_tiles):
        out = tmp_path / f"{bench.__name__}.json"
        assert bench.main(["--out", str(out)]) == 2
        assert f"{bench.__name__.split('.')[-1]}: needs a CUDA GPU" in capsys.readouterr().err
        assert not out.exists()
