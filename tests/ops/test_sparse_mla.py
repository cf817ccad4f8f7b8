"""ops/sparse_mla: decode from fp8 V4 records and bf16 prefill against the fp64 reference,
within the per-element and norm error budget of tools/compare.py (set by PyTorch-in-bf16's
error on the same inputs)."""

import dataclasses
import math

import pytest
import torch

from deepinfer_sm80 import arch
from deepinfer_sm80.ops.kv_cache import quantize_and_insert_k_cache
from deepinfer_sm80.ops.sparse_mla import engine as mla_engine
from deepinfer_sm80.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill, tilelang_kernels
from deepinfer_sm80.ops.sparse_mla import triton_kernel as mla_kernels
from deepinfer_sm80.ops.sparse_mla.ref import (
    decode_rows,
    sparse_mla_decode_ref,
    sparse_mla_prefill_ref,
)
from tools import mutants
from tools.compare import assert_within_torch_budget
from tools.poison import move_cache, nan_empty, paged_cache

SCALE = 512**-0.5
WINDOW, TOPK, DSPARK_WIDTH = 128, 512, 192


@pytest.fixture(params=["triton", "tilelang"])
def engine(request, device, monkeypatch):
    """Both decode kernels: the Triton one everywhere, the TileLang one (attention_sm80.cuh)
    on a CUDA GPU only -- on CPU its check is the sm_80/sm_86 fit
    (test_tilelang_kernels_fit_ampere)."""
    if request.param == "tilelang" and device.type != "cuda":
        pytest.skip("the TileLang decode runs only on a CUDA GPU")
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, request.param)
    return request.param


@pytest.fixture(params=["triton", "tilelang"])
def prefill_engine(request, device, monkeypatch):
    """Both prefill kernels: Triton everywhere, the TileLang wide kernel over bf16 rows
    (attention_sm80.cuh) on a CUDA GPU only."""
    if request.param == "tilelang" and device.type != "cuda":
        pytest.skip("the TileLang prefill runs only on a CUDA GPU")
    monkeypatch.setenv(mla_engine.PREFILL_ENGINE_ENV, request.param)
    return request.param


def _realistic_k(n: int, g: torch.Generator) -> torch.Tensor:
    """Latent rows like the model's: N(0, 2) with per-row magnitude spread and outliers."""
    k = torch.randn(n, 512, generator=g) * 1.4
    k *= torch.exp(torch.randn(n, 1, generator=g) * 0.3)
    k[torch.rand(n, 512, generator=g) < 0.005] *= 12
    return k.bfloat16()


def _queries(T: int, Hp: int, k_rows: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Queries whose logits spread over +-10 and more: each head leans towards a few
    rows (peaked softmax), heads differ in temperature."""
    q = torch.randn(T, Hp, 512, generator=g) * 1.4
    pick = torch.randint(0, k_rows.shape[0], (T, Hp), generator=g)
    temp = torch.linspace(0.2, 1.5, Hp)[None, :, None]
    q = q + temp * k_rows.float()[pick] * 2
    return q.bfloat16()


@dataclasses.dataclass
class DecodeCase:
    q: torch.Tensor
    cache: torch.Tensor
    idx: torch.Tensor
    lens: torch.Tensor
    sink: torch.Tensor | None
    extra: torch.Tensor | None = None
    extra_idx: torch.Tensor | None = None
    extra_lens: torch.Tensor | None = None

    def token(self, t: int) -> "DecodeCase":
        """Token t alone, on the same caches (batch-invariance checks)."""
        one = slice(t, t + 1)
        return DecodeCase(
            self.q[one].clone(),
            self.cache,
            self.idx[one].clone(),
            self.lens[one].clone(),
            self.sink,
            self.extra,
            self.extra_idx[one].clone() if self.extra_idx is not None else None,
            self.extra_lens[one].clone() if self.extra_lens is not None else None,
        )

    def run(self, heads, out=None):
        return sparse_mla_decode(
            self.q,
            self.cache,
            self.idx,
            self.lens,
            SCALE,
            self.sink,
            self.extra,
            self.extra_idx,
            self.extra_lens,
            out=out,
            num_heads=heads,
        )

    def ref(self, heads, precision):
        cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
        extra = None if self.extra is None else move_cache(self.extra, "cpu")
        return sparse_mla_decode_ref(
            cpu(self.q),
            move_cache(self.cache, "cpu"),
            cpu(self.idx),
            cpu(self.lens),
            SCALE,
            cpu(self.sink),
            extra,
            cpu(self.extra_idx),
            cpu(self.extra_lens),
            num_heads=heads,
            precision=precision,
        )


def _cache_with(rows: torch.Tensor, block_size: int, g, device):
    """A paged cache holding ``rows`` at shuffled slots; every other byte is 0xFF (NaN
    e4m3, +inf scale), so reading anything unselected poisons the output."""
    n = rows.shape[0]
    num_blocks = -(-n // block_size) + 2
    cache = paged_cache(num_blocks, block_size, device=device)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    quantize_and_insert_k_cache(rows.to(device), cache, slots.to(device), block_size)
    return cache, slots


def make_decode_case(
    T,
    Hp,
    *,
    main_width=WINDOW,
    extra_width=TOPK,
    ratio=1,
    seed=0,
    lens=None,
    extra_lens=None,
    sink=True,
    device="cpu",
    holes=0.05,
    cached_rows=None,
    block_size=64,
):
    """``cached_rows(rows) -> rows`` changes what the caches hold (the queries are drawn
    from the unchanged rows). ``block_size``: the main cache's; the extra cache's is
    ``block_size // ratio``."""
    g = torch.Generator().manual_seed(seed)
    keep = cached_rows or (lambda rows: rows)
    main_rows = _realistic_k(3 * main_width, g)
    cache, main_slots = _cache_with(keep(main_rows), block_size, g, device)
    pick = torch.randint(0, main_rows.shape[0], (T, main_width), generator=g)
    idx = main_slots[pick].int()
    idx[torch.rand(T, main_width, generator=g) < holes] = -1
    lens_t = torch.tensor(lens if lens is not None else [main_width] * T, dtype=torch.int32)
    case = DecodeCase(q=None, cache=cache, idx=idx.to(device), lens=lens_t.to(device), sink=None)
    all_rows = main_rows
    if extra_width:
        extra_rows = _realistic_k(extra_width * 2, g)
        extra, extra_slots = _cache_with(keep(extra_rows), block_size // ratio, g, device)
        epick = torch.randint(0, extra_rows.shape[0], (T, extra_width), generator=g)
        eidx = extra_slots[epick].int()
        eidx[torch.rand(T, extra_width, generator=g) < holes] = -1
        elens = torch.tensor(
            extra_lens if extra_lens is not None else [extra_width] * T, dtype=torch.int32
        )
        case.extra, case.extra_idx, case.extra_lens = extra, eidx.to(device), elens.to(device)
        all_rows = torch.cat([main_rows, extra_rows])
    case.q = _queries(T, Hp, all_rows, g).to(device)
    if sink:
        case.sink = (torch.randn(Hp, generator=g) * 2 + 4).to(device)
    return case


def _check_decode(case: DecodeCase, heads: int, name: str):
    T, Hp, _ = case.q.shape
    out = nan_empty(T, Hp, 512, device=case.q.device)
    got, lse = case.run(heads, out=out)
    assert got.data_ptr() == out.data_ptr()
    return got, _check_decode_output(case, heads, name, got, lse)


def _check_decode_output(case: DecodeCase, heads: int, name: str, got, lse, refs=None):
    """``got``/``lse``, a decode of ``case`` into a NaN-filled ``[T, Hp, 512]``, against the
    references (``refs``: precision -> ``case.ref(heads, precision)``, if already made);
    returns the error budget's report."""
    refs = refs or {p: case.ref(heads, p) for p in ("fp64", "bf16")}
    (ref, ref_lse), (torch_bf16, _) = refs["fp64"], refs["bf16"]
    report = assert_within_torch_budget(
        name, got[:, :heads].float().cpu(), ref[:, :heads], torch_bf16[:, :heads]
    )
    # Padded heads get no work: their rows keep the poison.
    assert torch.isnan(got[:, heads:]).all()
    finite = torch.isfinite(ref_lse[:, :heads])
    assert torch.equal(torch.isfinite(lse[:, :heads].cpu()), finite)
    assert torch.allclose(
        lse[:, :heads].cpu()[finite].double(), ref_lse[:, :heads][finite], atol=1e-3
    )
    return report


@pytest.mark.parametrize("heads", [64, 32, 16, 8], ids=lambda h: f"TP{64 // h}-H{h}")
@pytest.mark.parametrize("ratio", [1, 2])
def test_decode_swa_plus_topk_tp_heads(device, engine, heads, ratio):
    case = make_decode_case(
        2, 64, ratio=ratio, seed=heads + ratio, device=device, lens=[128, 77], extra_lens=[512, 301]
    )
    _check_decode(case, heads, f"decode H{heads} ratio{ratio}")


# 8 heads or fewer per rank run the TileLang kernel's narrow variant (transposed MMAs,
# 32-row tiles); the corner-case tests below run it on the GPU tier too.
NARROW = pytest.param(8, marks=pytest.mark.gpu, id="narrow-H8")
NARROW_H5 = pytest.param(5, marks=pytest.mark.gpu, id="narrow-H5")  # 3 idle owner warps


@pytest.mark.parametrize("heads", [16, NARROW])
@pytest.mark.parametrize("block_size", [48, 256])
def test_decode_block_sizes(device, engine, heads, block_size):
    """Pages of 48 rows (24 in the ratio-2 cache: not powers of two) and of 256, where
    the tests elsewhere use 64 (and 32)."""
    case = make_decode_case(
        2,
        64,
        ratio=2,
        seed=block_size,
        device=device,
        lens=[128, 70],
        extra_lens=[401, 512],
        block_size=block_size,
    )
    _check_decode(case, heads, f"block size {block_size}")


@pytest.mark.parametrize("heads", [16, NARROW])
@pytest.mark.parametrize("width", [WINDOW, DSPARK_WIDTH], ids=["swa128", "dspark192"])
def test_decode_swa_only_layers(device, engine, width, heads):
    case = make_decode_case(
        3,
        64,
        main_width=width,
        extra_width=0,
        seed=width,
        device=device,
        lens=[width, 1, width - 61],
    )
    _check_decode(case, heads, f"swa-only {width}")


@pytest.mark.parametrize("heads", [16, NARROW, NARROW_H5])
def test_decode_empty_rows_give_zero_and_no_nan(device, engine, heads):
    """All -1 indices, zero lengths: out = 0 (the sink alone in the denominator). 5 heads:
    3 of the narrow kernel's 8 owner warps have only a padded head."""
    case = make_decode_case(3, 64, seed=5, device=device, lens=[0, 128, 0], extra_lens=[0, 0, 512])
    case.idx[1] = -1
    case.extra_idx[2] = -1
    got, lse = case.run(heads, out=nan_empty(3, 64, 512, device=device))
    assert (got[:, :heads] == 0).all() and torch.isinf(lse[:, :heads]).all()
    assert torch.isnan(got[:, heads:]).all()
    case.sink = None
    got, _ = case.run(heads, out=nan_empty(3, 64, 512, device=device))
    assert (got[:, :heads] == 0).all()


@pytest.mark.parametrize("heads", [32, NARROW, NARROW_H5])
def test_decode_without_sink_and_without_lengths(device, engine, heads):
    case = make_decode_case(2, 64, seed=9, sink=False, device=device)
    case.lens = None
    case.extra_lens = None
    _check_decode(case, heads, "no sink, no lengths")


HUGE_GROUP, TINY_GROUP = 3, 5  # NoPE scale groups of 64 dims


def _extreme_groups(rows: torch.Tensor) -> torch.Tensor:
    """Every third row's group 3 times 2^80 (UE8M0 byte ~203: past the TileLang kernel's
    folded-scale range, so its exact slow path runs, mixed with fast rows in one tile);
    group 5 of every row made of e4m3 subnormal codes (values ~2^-9 under a scale set
    by one 400)."""
    rows = rows.float().clone()
    huge = slice(64 * HUGE_GROUP, 64 * HUGE_GROUP + 64)
    tiny = slice(64 * TINY_GROUP, 64 * TINY_GROUP + 64)
    rows[::3, huge] *= 2.0**80
    rows[:, tiny] = rows[:, tiny] * 2.0**-10
    rows[:, 64 * TINY_GROUP] = 400.0
    return rows.bfloat16()


@pytest.mark.parametrize("heads", [16, NARROW])
@pytest.mark.parametrize("q_shift", [-80, 0], ids=["mixed-logits", "huge-logits"])
# Throughput splits are the TileLang kernels' alone: the Triton engine has no such case.
@pytest.mark.parametrize(
    "engine,splits",
    [("triton", "latency"), ("tilelang", "latency"), ("tilelang", "throughput")],
    indirect=["engine"],
)
def test_decode_extreme_scales_and_subnormal_codes(
    device, engine, monkeypatch, q_shift, heads, splits
):
    """Scales outside the TileLang fast path's fold and subnormal e4m3 codes decode
    exactly. With the huge group's query dims scaled down (-80) the huge rows mix with
    the others in the softmax; unscaled (0), their logits are ~2^80 and q * k must not
    overflow on the way (it did once: the query's 2^64 bias times a full decode). Both
    split modes: throughput runs the 640-row builds (the narrow kernel's register path)."""
    monkeypatch.setenv(mla_engine.DECODE_SPLITS_ENV, splits)
    case = make_decode_case(
        2,
        64,
        seed=41,
        device=device,
        lens=[128, 90],
        extra_lens=[512, 233],
        cached_rows=_extreme_groups,
    )
    huge = slice(64 * HUGE_GROUP, 64 * HUGE_GROUP + 64)
    case.q[:, :, huge] = (case.q[:, :, huge].float() * 2.0**q_shift).bfloat16()
    got, _ = _check_decode(case, heads, f"extreme scales, q shift {q_shift}")
    assert torch.isfinite(got[:, :heads]).all()
    assert got[:, :heads, huge].float().abs().amax() > 2.0**70  # the huge rows did take part
    tiny = got[:, :heads, 64 * TINY_GROUP + 1 : 64 * TINY_GROUP + 64].float().abs()
    assert 0 < tiny.amax() < 1  # small-code dims came through, and stayed small


def test_fast_path_raw_decode_and_folded_factors():
    """attention_sm80.cuh's fast path: sign | magnitude << 4 read as bf16 is the e4m3 value
    times 2^-120 for every non-NaN code (subnormals included); exponent field s + 56 is
    2^(s - 71) in fp32 and in bf16 for every scale byte s <= 198; 0x5F80 is 2^64."""
    import re
    from pathlib import Path

    cuh = (Path(mla_kernels.__file__).with_name("attention_sm80.cuh")).read_text()
    assert re.search(r"\(x & 0x80008000u\) \| \(\(x & 0x7F007F00u\) >> 4\)", cuh)
    assert "kFieldOffset = 56" in cuh and "kFastMaxScale = 198" in cuh
    assert "kUnitField = 127" in cuh and "kFullDecodeShift = 64" in cuh
    codes = torch.arange(256, dtype=torch.int32)
    raw = (((codes & 0x80) << 8) | ((codes & 0x7F) << 4)).to(torch.int16).view(torch.bfloat16)
    value = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
    ok = (codes & 0x7F) != 0x7F
    assert ok.sum() == 254
    assert torch.equal(raw.float()[ok] * 2.0**120, value[ok])
    s = torch.arange(199, dtype=torch.int32)
    want = torch.exp2((s - 71).double())
    assert torch.equal(((s + 56) << 23).view(torch.float32).double(), want)
    assert torch.equal(((s + 56) << 7).to(torch.int16).view(torch.bfloat16).double(), want)
    assert torch.tensor([0x5F80], dtype=torch.int16).view(torch.bfloat16).item() == 2.0**64


class _LaunchCounter:
    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def _with_rows_per_split(monkeypatch, rows):
    for name in ("sparse_mla.decode", "sparse_mla.decode_tilelang"):
        cfg = arch.KERNEL_CONFIGS[name]
        consts = {**cfg.constexpr_dict(), "ROWS_PER_SPLIT": rows}
        monkeypatch.setitem(
            arch.KERNEL_CONFIGS, name, dataclasses.replace(cfg, constexprs=tuple(consts.items()))
        )


@pytest.mark.parametrize("heads", [16, NARROW])
def test_direct_output_path_launches_no_reduction(device, engine, monkeypatch, heads):
    counter = _LaunchCounter(mla_kernels.sparse_mla_reduce_kernel)
    monkeypatch.setattr(mla_kernels, "sparse_mla_reduce_kernel", counter)
    swa = make_decode_case(2, 64, extra_width=0, seed=1, device=device)
    swa.run(heads)
    assert counter.launches == 0  # 128 rows <= ROWS_PER_SPLIT: one split, written directly
    full = make_decode_case(2, 64, seed=1, device=device)
    full.run(heads)
    # 640 rows can split: one reduction launch, unless the TileLang kernel merges the
    # splits itself (its default)
    merged = engine == "tilelang" and tilelang_kernels.MERGE_SPLITS
    assert counter.launches == (0 if merged else 1)
    _with_rows_per_split(monkeypatch, 1024)
    full.run(heads)
    assert counter.launches == (0 if merged else 1)  # 1024 rows per split: direct again


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 16, NARROW, NARROW_H5])
def test_tilelang_in_kernel_merge_against_the_reduction(device, monkeypatch, heads):
    """The TileLang kernel's in-kernel merge of a token's splits (the CTA that arrives
    last folds them) against the separate Triton reduction: both within the budget, no
    reduction launch when merging, the same result up to rounding (both fold in split
    order), deterministic, and the arrival counters back at zero after every call.
    Tokens with 4, 3, 2 and 1 splits and none; then 40 splits (ten fold steps)."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    counter = _LaunchCounter(mla_kernels.sparse_mla_reduce_kernel)
    monkeypatch.setattr(mla_kernels, "sparse_mla_reduce_kernel", counter)
    case = make_decode_case(
        5, 64, seed=41, device=device, lens=[128, 128, 60, 0, 128], extra_lens=[512, 100, 3, 0, 317]
    )
    results = {}
    for merge in (False, True):
        monkeypatch.setattr(tilelang_kernels, "MERGE_SPLITS", merge)
        results[merge], _ = _check_decode(case, heads, f"merge={merge}")
    assert counter.launches == 1  # the reduction ran for merge=False only
    again, _ = case.run(heads)
    merged = results[True][:, :heads]
    assert torch.equal(again[:, :heads].view(torch.int16), merged.view(torch.int16))
    ref, _ = case.ref(heads, "fp64")
    torch_bf16, _ = case.ref(heads, "bf16")
    reduced = results[False][:, :heads].float().cpu()
    assert_within_torch_budget(
        "merge vs reduction",
        merged.float().cpu(),
        reduced,
        torch_bf16[:, :heads] - ref[:, :heads] + reduced,
    )
    _with_rows_per_split(monkeypatch, 16)  # 40 splits for 640 rows
    _check_decode(case, heads, "40 splits merged")
    torch.cuda.synchronize()
    (counters,) = tilelang_kernels._counters.values()
    assert counters.abs().sum().item() == 0


def test_split_counters_grow_and_keep_old_buffers_alive(monkeypatch):
    """The merge's counters (checked on CPU tensors: the bookkeeping is device-neutral):
    zeroed once, shared while large enough, replaced by a larger zeroed buffer when not,
    the old one kept alive (CUDA graphs captured earlier hold its address); one counter
    per (token, head block) of the kernel that runs (8 heads per CTA at 8 heads or fewer,
    16 above)."""
    monkeypatch.setattr(tilelang_kernels, "_counters", {})
    monkeypatch.setattr(tilelang_kernels, "_kept_alive", [])
    assert tilelang_kernels.counter_slots(3, 8) == 3
    assert tilelang_kernels.counter_slots(3, 5) == 3
    assert tilelang_kernels.counter_slots(3, 64) == 12
    assert tilelang_kernels.counter_slots(3, 24) == 6
    first = tilelang_kernels.split_counters("cpu", 100)
    assert first.dtype == torch.int32 and first.numel() >= 100 and not first.any()
    assert tilelang_kernels.split_counters("cpu", first.numel()) is first
    bigger = tilelang_kernels.split_counters("cpu", first.numel() + 1)
    assert bigger.numel() > first.numel() and not bigger.any()
    assert tilelang_kernels._kept_alive == [first]
    assert tilelang_kernels.split_counters("cpu", 1) is bigger
    tilelang_kernels.reserve_split_counters("cpu", max_tokens=10_000)
    assert tilelang_kernels.split_counters("cpu", 1).numel() >= 40_000  # 64 heads: 4 blocks


@pytest.mark.gpu
def test_tilelang_merge_counters_allocated_inside_a_capture(device, monkeypatch, caplog):
    """No counters reserved before a CUDA-graph capture: that graph gets its own buffer,
    zeroed at the start of each replay, with a warning; replays stay correct."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    case = make_decode_case(4, 64, seed=43, device=device)
    out = torch.empty_like(case.q)
    case.run(8, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    monkeypatch.setattr(tilelang_kernels, "_counters", {})
    graph = torch.cuda.CUDAGraph()
    with caplog.at_level("WARNING", logger="deepinfer_sm80.sparse_mla"), torch.cuda.graph(graph):
        case.run(8, out=out)
    assert "inside a CUDA-graph capture" in caplog.text
    assert tilelang_kernels._counters == {}  # the graph's own buffer is not shared
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager, _ = case.run(8)
        assert torch.equal(out[:, :8].view(torch.int16), eager[:, :8].view(torch.int16))


@pytest.mark.parametrize("heads", [16, NARROW])
def test_split_and_unsplit_agree(device, engine, monkeypatch, heads):
    case = make_decode_case(2, 64, seed=11, device=device, lens=[128, 100], extra_lens=[512, 3])
    split, _ = _check_decode(case, heads, "split (256 rows)")
    _with_rows_per_split(monkeypatch, 1024)
    whole, _ = _check_decode(case, heads, "unsplit")
    ref, _ = case.ref(heads, "fp64")
    torch_bf16, _ = case.ref(heads, "bf16")
    assert_within_torch_budget(
        "split vs unsplit",
        split[:, :heads].float().cpu(),
        whole[:, :heads].float().cpu(),
        torch_bf16[:, :heads] - ref[:, :heads] + whole[:, :heads].float().cpu(),
    )


# 336 and 640 rows exercise the TileLang narrow kernel's register path: TileLang only.
@pytest.mark.parametrize(
    "engine,rows",
    [(e, r) for e in ("triton", "tilelang") for r in (16, 48, 208, 320, 336, 640)
     if e == "tilelang" or r <= 320],
    indirect=["engine"],
)  # fmt: skip
def test_decode_split_sizes(device, engine, monkeypatch, rows):
    """Split sizes off the shipped one: 16 rows (40 splits), 48 and 208 (a split's row mask
    ends inside a 32-bit word: the TileLang kernel deals 482 rows as 176 + 176 + 130), 320
    (the TileLang prologue resolves rows in two rounds of 256 threads), 336 and 640 (the
    narrow kernel's register path for PV, whose tables do not fit beside the slices). 8
    heads: the TileLang warps that own only padded head rows skip their softmax work, and
    the output must not notice."""
    _with_rows_per_split(monkeypatch, rows)
    case = make_decode_case(
        3, 64, seed=rows, device=device, lens=[128, 93, 0], extra_lens=[512, 389, 171]
    )
    _check_decode(case, 8, f"{rows} rows per split")


@pytest.mark.parametrize("heads", [32, NARROW])
def test_decode_deterministic_and_batch_invariant(device, engine, heads):
    """A token's output is bit-identical alone, in a batch, and run to run."""
    n_batch = 64 if device.type == "cuda" else 6
    batch = make_decode_case(
        n_batch + 1,
        64,
        seed=21,
        device=device,
        lens=[128 - (i % 5) for i in range(n_batch + 1)],
        extra_lens=[512 - 37 * (i % 9) for i in range(n_batch + 1)],
    )
    first, _ = batch.run(heads)
    again, _ = batch.run(heads)
    assert torch.equal(first[:, :heads].view(torch.int16), again[:, :heads].view(torch.int16))
    t = n_batch // 2
    single, _ = batch.token(t).run(heads)
    assert torch.equal(single[0, :heads].view(torch.int16), first[t, :heads].view(torch.int16))


def _with_decode_constexpr(monkeypatch, name: str, value: int):
    cfg = arch.KERNEL_CONFIGS["sparse_mla.decode_tilelang"]
    consts = {**cfg.constexpr_dict(), name: value}
    monkeypatch.setitem(
        arch.KERNEL_CONFIGS,
        "sparse_mla.decode_tilelang",
        dataclasses.replace(cfg, constexprs=tuple(consts.items())),
    )


def _with_splits_fastest(monkeypatch, on: bool):
    _with_decode_constexpr(monkeypatch, "SPLITS_FASTEST", int(on))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 16, NARROW, NARROW_H5])
@pytest.mark.parametrize("rows", [16, 192, 640])
def test_splits_fastest_grid_gives_the_same_bits(device, monkeypatch, heads, rows):
    """arch.py SPLITS_FASTEST=1 (a 1-D grid, a token's splits side by side) gives the
    default grid order's bits, out and lse: 40, 4 and 1 splits per token (the in-kernel
    merge, and the direct output; 640 rows: the narrow kernel's register path), tokens
    with fewer splits and with none, eagerly and under CUDA-graph replay, and the merge's
    counters are back at zero."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    _with_rows_per_split(monkeypatch, rows)
    case = make_decode_case(
        5, 64, seed=43, device=device, lens=[128, 128, 60, 0, 128], extra_lens=[512, 100, 3, 0, 317]
    )
    want, want_lse = case.run(heads)
    _with_splits_fastest(monkeypatch, True)
    got, got_lse = case.run(heads)
    bits = lambda x: x[:, :heads].contiguous().view(torch.int32 if x.dim() == 2 else torch.int16)  # noqa: E731
    assert torch.equal(bits(got), bits(want)) and torch.equal(bits(got_lse), bits(want_lse))
    out = torch.empty_like(case.q)
    case.run(heads, out=out)  # compiled already; outside the capture all the same
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, graph_lse = case.run(heads, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(want)) and torch.equal(bits(graph_lse), bits(want_lse))
    for counters in tilelang_kernels._counters.values():
        assert counters.abs().sum().item() == 0


# ------------------------------------------------------------------ head tiles
# arch.py HEAD_TILES > 1: the narrow kernel with 2 or 4 n-tiles of 8 heads per CTA serves
# more than 8 heads per rank (AttentionVariant.head_tiles). Off by default; these tests
# run it wherever the GPU tier runs.


def _assert_token_and_graph_bits(case, heads: int, got: torch.Tensor) -> None:
    """Token 2 alone gives its bits in the batch ``got``; a CUDA-graph replay gives the
    eager bits; the split merge's counters are back at zero."""
    bits = lambda x: x[:, :heads].contiguous().view(torch.int16)  # noqa: E731
    single, _ = case.token(2).run(heads)
    assert torch.equal(bits(single)[0], bits(got)[2])
    out = torch.empty_like(case.q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        case.run(heads, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(got))
    for counters in tilelang_kernels._counters.values():
        assert counters.abs().sum().item() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [2, 4])
@pytest.mark.parametrize("heads", [64, 32, 20, 16, 9])
@pytest.mark.parametrize("rows", [16, 192, 640])
def test_head_tile_kernel_against_the_reference(device, monkeypatch, tiles, heads, rows):
    """Against the fp64 reference on the error budget (padded heads keep their NaN poison,
    lse within 1e-3): 40, 4 and 1 splits per token, tokens with fewer splits and with
    none, head counts that fill 1 to 4 CTAs and leave owner warps idle (9, 20); one
    token alone gives its bits in the batch; a CUDA-graph replay gives the eager bits;
    the merge's counters are back at zero."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    _with_rows_per_split(monkeypatch, rows)
    _with_decode_constexpr(monkeypatch, "HEAD_TILES", tiles)
    narrow, used = tilelang_kernels.decode_kernel_shape(heads)
    assert narrow and used == min(tiles, 2 if heads <= 16 else 4)
    case = make_decode_case(
        5, 64, seed=heads + rows, device=device, lens=[128, 128, 60, 0, 128],
        extra_lens=[512, 100, 3, 0, 317],
    )  # fmt: skip
    got, _ = _check_decode(case, heads, f"head tiles {tiles}, H{heads}, {rows} rows")
    _assert_token_and_graph_bits(case, heads, got)


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", mutants.MUTANTS)
def test_head_tile_budget_rejects_every_mutant(device, monkeypatch, mutant):
    """test_decode_budget_rejects_every_mutant on the head-tile kernel, 32 heads in one
    CTA (HEAD_TILES 4)."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    _with_decode_constexpr(monkeypatch, "HEAD_TILES", 4)
    heads = 32
    _assert_budget_rejects(device, "tilelang-head-tiles", heads, mutant)


def test_head_tile_variant_and_refusals():
    td = tilelang_kernels
    v = td.AttentionVariant(128, 512, True, True, 192, narrow=True, head_tiles=4)
    assert (v.heads_per_cta, v.register_pv, v.min_ctas_per_sm) == (32, True, 1)
    assert v.label == "sparse_mla.decode_tl[128+512,r192,p1,h32]"
    assert v.callee().endswith(", 192, 4, 1, 56408, false, true, false, 4>")
    assert v.smem_bytes() == 56408 and v.smem_optin  # 32 KB of partial logits
    two = td.AttentionVariant(128, 512, True, True, 640, narrow=True, head_tiles=2)
    assert two.heads_per_cta == 16 and two.smem_bytes() <= 48 * 1024 and not two.smem_optin
    plain = td.AttentionVariant(128, 512, True, True, 192, narrow=True)
    assert plain.callee().endswith(", false, false>") and plain.min_ctas_per_sm == 2
    with pytest.raises(ValueError, match=r"head_tiles: one of \(1, 2, 4\), got 3"):
        td.AttentionVariant(128, 512, True, True, 192, narrow=True, head_tiles=3)
    with pytest.raises(ValueError, match="narrow decode kernel"):
        td.AttentionVariant(128, 512, True, True, 192, head_tiles=2)
    with pytest.raises(ValueError, match="narrow decode kernel"):
        td.prefill_variant(640, True, True, narrow=True).__class__(
            640, 0, True, True, 640, narrow=True, bf16_rows=True, head_tiles=2
        )


@pytest.mark.parametrize(
    ("most", "heads", "shape"),
    [
        (1, 8, (True, 1)), (1, 16, (False, 1)), (1, 64, (False, 1)),
        (2, 5, (True, 1)), (2, 16, (True, 2)), (2, 32, (True, 2)),
        (4, 9, (True, 2)), (4, 16, (True, 2)), (4, 20, (True, 4)), (4, 64, (True, 4)),
    ],
)  # fmt: skip
def test_decode_kernel_shape_follows_head_tiles(monkeypatch, most, heads, shape):
    _with_decode_constexpr(monkeypatch, "HEAD_TILES", most)
    assert tilelang_kernels.decode_kernel_shape(heads) == shape
    narrow, tiles = shape
    per_cta = 8 * tiles if narrow else 16
    assert tilelang_kernels.counter_slots(10, heads) == 10 * -(-heads // per_cta)
    with_tiles = [v for v in tilelang_kernels.shipped_variants() if v.head_tiles > 1]
    assert {v.head_tiles for v in with_tiles} == {t for t in (2, 4) if t <= most}


def test_an_unknown_head_tile_count_is_refused(monkeypatch):
    _with_decode_constexpr(monkeypatch, "HEAD_TILES", 3)
    with pytest.raises(ValueError, match=r"HEAD_TILES: one of \(1, 2, 4\), got 3"):
        tilelang_kernels.decode_kernel_shape(32)


@pytest.mark.aot
def test_head_tile_kernels_fit_ampere():
    """16 and 32 heads per CTA at both split sizes compile for sm_80 and sm_86 without
    spills, one CTA per SM; 32 heads takes opt-in shared memory within each arch's
    per-block limit."""
    from deepinfer_sm80.ampere_fit import fit_violations, format_reports
    from deepinfer_sm80.tilelang_build import fit_reports

    variants = [
        tilelang_kernels.AttentionVariant(128, 512, True, True, rows, narrow=True, head_tiles=t)
        for t in (2, 4)
        for rows in (192, 640)
    ]
    reports = fit_reports(variants, (80, 86))
    print(format_reports(reports))
    assert fit_violations(reports) == []
    assert all(r.min_ctas_per_sm == 1 and r.registers > 128 for r in reports)
    assert {r.smem_optin for r in reports if "h32" in r.label} == {True}


# ------------------------------------------------------------------ QK from registers
# arch.py QK_REGISTERS 1: the wide kernel's NoPE warps take QK's B fragments from their
# decoded registers, the query slice loaded in their dim order
# (AttentionVariant.qk_registers). Off by default; these tests run it wherever the GPU
# tier runs.


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 32, 16, 9])
@pytest.mark.parametrize("rows", [16, 192, 640])
def test_qk_register_kernel_against_the_reference(device, monkeypatch, heads, rows):
    """Against the fp64 reference on the error budget: 40, 4 and 1 splits per token,
    tokens with fewer splits and with none, idle owner warps (9 heads); rows past the
    fold's scale range (the full decode) mixed with fast rows in a tile; one token alone
    gives its bits in the batch; a CUDA-graph replay gives the eager bits; the merge's
    counters are back at zero."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    _with_rows_per_split(monkeypatch, rows)
    _with_decode_constexpr(monkeypatch, "QK_REGISTERS", 1)
    wide = [v for v in tilelang_kernels.shipped_variants() if not v.narrow and not v.bf16_rows]
    assert wide and all(v.qk_registers for v in wide)
    case = make_decode_case(
        5, 64, seed=heads + rows + 1, device=device, lens=[128, 128, 60, 0, 128],
        extra_lens=[512, 100, 3, 0, 317], cached_rows=_extreme_groups,
    )  # fmt: skip
    huge = slice(64 * HUGE_GROUP, 64 * HUGE_GROUP + 64)
    case.q[:, :, huge] = (case.q[:, :, huge].float() * 2.0**-80).bfloat16()
    got, _ = _check_decode(case, heads, f"QK from registers, H{heads}, {rows} rows")
    assert got[:, :heads, huge].float().abs().amax() > 2.0**70  # the full decode took part
    _assert_token_and_graph_bits(case, heads, got)


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", mutants.MUTANTS)
def test_qk_register_budget_rejects_every_mutant(device, monkeypatch, mutant):
    """test_decode_budget_rejects_every_mutant on the wide kernel with QK from registers."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    _with_decode_constexpr(monkeypatch, "QK_REGISTERS", 1)
    _assert_budget_rejects(device, "tilelang-qk-registers", 16, mutant)


def test_qk_register_variant_and_refusals(monkeypatch):
    td = tilelang_kernels
    v = td.AttentionVariant(128, 512, True, True, 192, qk_registers=True)
    off = td.AttentionVariant(128, 512, True, True, 192)
    assert v != off and v.label == off.label[:-1] + ",qk-regs]"
    assert v.callee() == off.callee()[:-1] + ", false, true>"
    fastest = td.AttentionVariant(128, 512, True, True, 192, splits_fastest=True, qk_registers=True)
    assert fastest.callee().endswith(", true, true>")
    assert (v.smem_bytes(), v.min_ctas_per_sm) == (off.smem_bytes(), 2)
    for bad in ({"narrow": True}, {"bf16_rows": True, "rows_per_split": 640, "extra_width": 0}):
        kw = {"main_width": 640 if "bf16_rows" in bad else 128, "extra_width": 512,
              "has_len": True, "has_sink": True, "rows_per_split": 192, **bad}  # fmt: skip
        with pytest.raises(ValueError, match="qk_registers: QK from decoded registers"):
            td.AttentionVariant(**kw, qk_registers=True)
    # The flag reaches the shipped wide decode variants only, and launch() picks them.
    _with_decode_constexpr(monkeypatch, "QK_REGISTERS", 1)
    shipped = td.shipped_variants()
    assert {v.qk_registers for v in shipped if not v.narrow and not v.bf16_rows} == {True}
    assert not any(v.qk_registers for v in shipped if v.narrow or v.bf16_rows)


def test_ctas_per_sm_variant_and_refusals(monkeypatch):
    td = tilelang_kernels
    two = td.AttentionVariant(128, 512, True, True, 192)
    three = td.AttentionVariant(128, 512, True, True, 192, ctas_per_sm=3)
    assert three != two and three.label == two.label[:-1] + ",ctas3]"
    assert (three.callee(), three.smem_bytes()) == (two.callee(), two.smem_bytes())
    assert (two.min_ctas_per_sm, three.min_ctas_per_sm) == (2, 3)
    with pytest.raises(ValueError, match=r"ctas_per_sm: one of \(2, 3\), got 4"):
        td.AttentionVariant(128, 512, True, True, 192, ctas_per_sm=4)
    for bad in ({"narrow": True}, {"bf16_rows": True, "rows_per_split": 640, "extra_width": 0}):
        kw = {"main_width": 640 if "bf16_rows" in bad else 128, "extra_width": 512,
              "has_len": True, "has_sink": True, "rows_per_split": 192, **bad}  # fmt: skip
        with pytest.raises(ValueError, match="ctas_per_sm=3: the CTAs per SM are a wide decode"):
            td.AttentionVariant(**kw, ctas_per_sm=3)
    # arch.py's CTAS_PER_SM reaches the shipped wide decode variants only.
    _with_decode_constexpr(monkeypatch, "CTAS_PER_SM", 3)
    shipped = td.shipped_variants()
    assert {v.ctas_per_sm for v in shipped if not v.narrow and not v.bf16_rows} == {3}
    assert {v.ctas_per_sm for v in shipped if v.narrow or v.bf16_rows} == {2}


@pytest.mark.aot
def test_three_ctas_fit_sm80_not_sm86():
    """Built for 3 CTAs per SM the wide kernel gets 80 registers on sm_80 and sm_86 and
    spills, which the fit check names on both; three CTAs' shared memory fits sm_80's
    164 KB per SM, and the check refuses it on sm_86 (100 KB)."""
    from deepinfer_sm80 import tilelang_build
    from deepinfer_sm80.ampere_fit import fit_violations

    v = tilelang_kernels.AttentionVariant(128, 512, True, True, 640, 1, False, ctas_per_sm=3)
    reports = tilelang_build.fit_reports([v], (80, 86))
    assert [r.registers for r in reports] == [80, 80]
    print(fit_violations(reports))
    sm80, sm86 = fit_violations(reports[:1]), fit_violations(reports[1:])
    assert len(sm80) == 1 and "spills" in sm80[0] and "sm_80" in sm80[0]
    assert any("shared" in p and "sm_86" in p for p in sm86), sm86


@pytest.mark.aot
def test_qk_register_kernels_fit_ampere(monkeypatch):
    """arch.py QK_REGISTERS=1: the wide decode variants (latency and throughput split
    sizes, all three index widths) fit sm_80 and sm_86 at two CTAs per SM without
    spills, in the shipped kernels' shared memory."""
    from deepinfer_sm80 import tilelang_build
    from deepinfer_sm80.ampere_fit import fit_violations, format_reports

    _with_decode_constexpr(monkeypatch, "QK_REGISTERS", 1)
    variants = [v for v in tilelang_kernels.shipped_variants() if v.qk_registers]
    assert len(variants) == 4
    reports = tilelang_build.fit_reports(variants, (80, 86))
    print(format_reports(reports))
    assert len(reports) == 8 and fit_violations(reports) == []
    assert all(r.min_ctas_per_sm == 2 and r.registers <= 128 for r in reports)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [32, 8])
def test_decode_replays_under_cuda_graph(device, engine, heads):
    """DSpark decodes under full CUDA graphs: capture once, change the inputs in place,
    replay, and get what an eager call on the new inputs gives."""
    case = make_decode_case(8, 64, seed=31, device=device)
    out = torch.empty_like(case.q)
    case.run(heads, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        case.run(heads, out=out)
    fresh = make_decode_case(8, 64, seed=32, device=device)
    case.q.copy_(fresh.q)
    case.lens.copy_(torch.tensor([128, 3, 0, 77, 128, 128, 1, 64], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    eager, _ = case.run(heads)
    assert torch.equal(out[:, :heads].view(torch.int16), eager[:, :heads].view(torch.int16))


def test_decode_split_mode_choice(monkeypatch, caplog):
    """DEEPINFER_SPARSE_MLA_DECODE_SPLITS: latency (default) keeps arch.py's ROWS_PER_SPLIT;
    throughput gives the TileLang kernels one split per V4.1 token (640 rows) and leaves
    index rows that fit one split and the Triton kernel (with a warning) as they are;
    anything else is refused, naming the variable."""
    rps = arch.KERNEL_CONFIGS["sparse_mla.decode_tilelang"].constexpr_dict()["ROWS_PER_SPLIT"]
    choose = mla_engine.decode_rows_per_split
    monkeypatch.setattr(mla_engine, "_warned", set())  # warn-once state of earlier tests
    monkeypatch.delenv(mla_engine.DECODE_SPLITS_ENV, raising=False)
    assert choose("tilelang", 8, 640) == rps == 192
    monkeypatch.setenv(mla_engine.DECODE_SPLITS_ENV, "Throughput ")
    assert all(choose("tilelang", h, 640) == 640 for h in (5, 8, 16, 32, 64))
    assert choose("tilelang", 8, DSPARK_WIDTH) == rps  # one split already: same variant
    with caplog.at_level("WARNING", logger="deepinfer_sm80.sparse_mla"):
        assert choose("triton", 8, 640) == 128
    assert "throughput applies to the TileLang kernels" in caplog.text
    monkeypatch.setenv(mla_engine.DECODE_SPLITS_ENV, "fast")
    with pytest.raises(ValueError, match=r"DECODE_SPLITS='fast': expected one of latency, thr"):
        choose("tilelang", 8, 640)
    # the throughput variants are shipped (warmup and the image's AOT step build them),
    # within Ampere's 48 KB; the narrow one takes the register path for PV
    wide, narrow = [
        v
        for v in tilelang_kernels.shipped_variants()
        if v.rows_per_split == 640 and not v.bf16_rows
    ]
    assert not wide.narrow and wide.smem_bytes() <= 48 * 1024
    assert narrow.narrow and narrow.register_pv and narrow.smem_bytes() <= 48 * 1024
    assert narrow.callee().endswith(", false, true>")
    short = tilelang_kernels.AttentionVariant(128, 512, True, True, rps, narrow=True)
    assert not short.register_pv and short.callee().endswith(", false, false>")


def test_deploy_names_the_split_variable_the_kernels_read():
    """deploy/ and the kernels take DEEPINFER_SPARSE_MLA_DECODE_SPLITS from the registry
    (deploy/ never imports torch, envs.py neither)."""
    pytest.importorskip("pydantic")  # deploy's schema; the GPU machines run without it
    from deepinfer_sm80 import envs
    from deepinfer_sm80.deploy import topology

    assert topology.DECODE_SPLITS_ENV is mla_engine.DECODE_SPLITS_ENV is envs.DECODE_SPLITS_ENV


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [8, 5])
@pytest.mark.parametrize("rows", [192, 640])
def test_narrow_register_path_matches_the_slices_path(device, monkeypatch, heads, rows):
    """The narrow kernel's two PV paths (V^T from the slices by ldmatrix, or from the
    decoded registers by movmatrix) multiply the same values in the same order: forced
    either way, their outputs are bit-identical, with -1 holes, short and empty rows and
    full-decode scale bytes. (The slices path at 640 rows needs 56 KB of shared memory:
    the test GPU allows it, Ampere would not, so it never ships.)"""
    from deepinfer_sm80.tilelang_build import forget_compiled

    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    _with_rows_per_split(monkeypatch, rows)
    case = make_decode_case(
        5,
        64,
        seed=rows + heads,
        device=device,
        lens=[128, 101, 37, 1, 0],
        extra_lens=[512, 333, 48, 0, 0],
        cached_rows=_extreme_groups,
    )
    shipped = tilelang_kernels.AttentionVariant.register_pv
    runs = {}
    try:
        for forced in (False, True):
            tilelang_kernels.AttentionVariant.register_pv = property(
                lambda v, f=forced: f and v.narrow and not v.bf16_rows
            )
            forget_compiled()  # kernels are cached by variant, which does not name the path
            out, lse = case.run(heads)
            runs[forced] = (out[:, :heads].clone(), lse[:, :heads].clone())
    finally:
        tilelang_kernels.AttentionVariant.register_pv = shipped
        forget_compiled()
    assert torch.isfinite(runs[False][0]).all()
    assert torch.equal(runs[False][0].view(torch.int16), runs[True][0].view(torch.int16))
    assert torch.equal(runs[False][1], runs[True][1])


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 32, NARROW, NARROW_H5])
def test_decode_throughput_splits(device, monkeypatch, heads):
    """Throughput mode on the TileLang kernels (wide, and narrow for 8 heads or fewer):
    one split per token (no partials), within the budget against the fp64 reference,
    bit-identical alone and in a batch."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    monkeypatch.setenv(mla_engine.DECODE_SPLITS_ENV, "throughput")
    launched = []
    launch = tilelang_kernels.launch
    monkeypatch.setattr(
        tilelang_kernels, "launch", lambda *a, **k: launched.append(a[12]) or launch(*a, **k)
    )
    n = 17
    case = make_decode_case(
        n,
        64,
        seed=41,
        device=device,
        lens=[128 - (i % 5) for i in range(n - 1)] + [0],
        extra_lens=[512 - 37 * (i % 9) for i in range(n - 1)] + [0],
    )
    out, _ = _check_decode(case, heads, "throughput splits")
    assert launched and set(launched) == {640}
    t = 7
    single, _ = case.token(t).run(heads)
    assert torch.equal(single[0, :heads].view(torch.int16), out[t, :heads].view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 8])
@pytest.mark.parametrize("T", [1, 16, 64, 256])
def test_decode_production_shapes(device, engine, T, heads):
    case = make_decode_case(
        T,
        64,
        seed=T,
        device=device,
        lens=[128 - i % 3 for i in range(T)],
        extra_lens=[512 - i % 7 for i in range(T)],
    )
    _check_decode(case, heads, f"production T={T}")


# ------------------------------------------------------------------ decode mutants

# The error budget must reject every standard mutant (tools/mutants.py) on the same
# check the cases above pass; the message is the budget's, so it is the value check,
# not NaN poisoning or the lse check, that bites.
BUDGET_REJECTS = r"outside the per-element bound|relative L2 error"


def _entries_by_weight(case: DecodeCase, token: int = 0, head: int = 0):
    """(list name, entry, slot) of ``token``'s counted, valid entries, heaviest first for
    ``head`` (largest logit first: the rows a mutation of one row must hit to matter)."""
    q = case.q[token, head].cpu().double()
    found = []
    for which, cache, idx, lens in (
        ("main", case.cache, case.idx, case.lens),
        ("extra", case.extra, case.extra_idx, case.extra_lens),
    ):
        if cache is None:
            continue
        cpu_cache = move_cache(cache, "cpu")
        row = idx[token].cpu().long()
        n = row.numel() if lens is None else int(lens[token])
        entries = [e for e in range(n) if row[e] >= 0]
        rows = decode_rows(cpu_cache, row[entries])
        logits = rows.double() @ q
        found += [(float(w), which, e, int(row[e])) for w, e in zip(logits, entries, strict=True)]
    return [(which, e, slot) for _, which, e, slot in sorted(found, reverse=True)]


def _slot_written(cache, slot: int) -> bool:
    rows = cache.shape[0] * cache.shape[1]
    if not 0 <= slot < rows:
        return False
    return bool(torch.isfinite(decode_rows(move_cache(cache, "cpu"), torch.tensor([slot]))).all())


def _decode_mutant(case: DecodeCase, mutant: str):
    """(kernel_case, mutate): ``mutant`` of the decode on ``case`` is the kernel run on
    ``kernel_case`` (None: the unmutated output) with ``mutate`` applied to its output."""
    if mutant == "scale":
        return None, mutants.scale
    if mutant == "swap-heads":
        return None, mutants.swap_heads
    if mutant == "ignore-sink":
        return dataclasses.replace(case, sink=mutants.ignore_sink(case.sink)), None
    if mutant == "drop-tile":  # the SWA window's second tile
        return dataclasses.replace(case, idx=mutants.drop_tile(case.idx, tile=1)), None
    heaviest = _entries_by_weight(case)
    if mutant == "ue8m0-exponent":
        which, _, slot = heaviest[0]
        field = "cache" if which == "main" else "extra"
        shifted = mutants.shift_ue8m0_exponent(getattr(case, field), slot, group=0)
        return dataclasses.replace(case, **{field: shifted}), None
    if mutant == "neighbour-row":
        # the heaviest row whose neighbour holds a record (an unwritten one is NaN,
        # which poisoning catches without the budget)
        for which, entry, slot in heaviest:
            cache = case.cache if which == "main" else case.extra
            if _slot_written(cache, slot + 1):
                field = "idx" if which == "main" else "extra_idx"
                moved = mutants.read_neighbour(getattr(case, field), 0, entry)
                return dataclasses.replace(case, **{field: moved}), None
        raise AssertionError("no selected row of token 0 has a written neighbour")
    raise ValueError(f"mutant {mutant!r}: not one of {mutants.MUTANTS}")


_UNMUTATED_DECODES = {}  # engine -> (case, out, lse, refs): the interpreter is slow


def _unmutated_decode(device, engine, heads):
    """``engine`` keys the cache: the engine fixture's value, or a name for another kernel
    choice the caller has made."""
    if engine not in _UNMUTATED_DECODES:
        case = make_decode_case(1, 64, seed=16, device=device)
        # Sinks the softmax feels, from ~2 % to ~90 % of the weight across the heads: the
        # default ones carry < 1e-3 of it against these peaked logits, where leaving the
        # sink out changes nothing a bf16 output can show.
        _, lse = case.ref(64, "fp64")
        case.sink = (lse[0] + torch.linspace(-4, 2, 64, dtype=torch.float64)).float().to(device)
        out, lse = case.run(heads, out=nan_empty(1, 64, 512, device=device))
        refs = {p: case.ref(heads, p) for p in ("fp64", "bf16")}
        _UNMUTATED_DECODES[engine] = case, out, lse, refs
    return _UNMUTATED_DECODES[engine]


@pytest.mark.parametrize("mutant", mutants.MUTANTS)
def test_decode_budget_rejects_every_mutant(device, engine, mutant):
    """One token of a SWA window plus Top-K decode (128 + 512 rows), 16 heads, with a
    sink: the real kernel passes the checks _check_decode makes, each mutant of it fails
    there, on the error budget."""
    _assert_budget_rejects(device, engine, 16, mutant)


def _assert_budget_rejects(device, key: str, heads: int, mutant: str):
    """The unmutated decode (``_unmutated_decode(device, key, heads)``) passes
    _check_decode_output; ``mutant`` of it fails there, on the error budget."""
    case, out, lse, refs = _unmutated_decode(device, key, heads)
    _check_decode_output(case, heads, "unmutated", out, lse, refs)
    kernel_case, mutate = _decode_mutant(case, mutant)
    if kernel_case is not None:
        out, lse = kernel_case.run(heads, out=nan_empty(1, 64, 512, device=device))
    if mutate is not None:
        out = out.clone()
        out[:, :heads] = mutate(out[:, :heads])
    with pytest.raises(AssertionError, match=BUDGET_REJECTS):
        _check_decode_output(case, heads, f"mutant {mutant}", out, lse, refs)


# ------------------------------------------------------------------ prefill


def make_prefill_case(T, H, S, width, seed, device, holes=0.05):
    g = torch.Generator().manual_seed(seed)
    kv = _realistic_k(S, g)
    idx = torch.randint(0, S + 8, (T, width), generator=g, dtype=torch.int32)  # some >= S
    idx[torch.rand(T, width, generator=g) < holes] = -1
    q = _queries(T, H, kv, g)
    sink = torch.randn(H, generator=g) * 2 + 4
    return q.to(device), kv.to(device), idx.to(device), sink.to(device)


def _prefill_within_budget(name, got, q, kv, idx, sink, lens):
    """The error budget of a prefill output against the fp64 reference and PyTorch-bf16
    on the same inputs; returns (the budget's report, the reference lse)."""
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    args = (q.cpu(), kv.cpu(), idx.cpu(), SCALE, cpu(sink), cpu(lens))
    ref, ref_lse = sparse_mla_prefill_ref(*args)
    torch_bf16, _ = sparse_mla_prefill_ref(*args, precision="bf16")
    return assert_within_torch_budget(name, got.float().cpu(), ref, torch_bf16), ref_lse


@pytest.mark.parametrize("H", [64, 16, 8, 5])  # 8 and 5: the narrow kernel on TileLang
def test_prefill_against_reference(device, H, prefill_engine):
    T, S, W = 5, 700, 640
    q, kv, idx, sink = make_prefill_case(T, H, S, W, H, device)
    lens = torch.tensor([640, 513, 129, 1, 0], dtype=torch.int32, device=device)
    # Workspace rows no counted entry selects are NaN: entries past a token's length (and
    # -1, and rows past S) must never be read.
    counted = torch.arange(W, device=device)[None, :] < lens[:, None].long()
    used = idx[counted & (idx >= 0) & (idx < S)].long().unique()
    unused = torch.ones(S, dtype=torch.bool, device=device)
    unused[used] = False
    assert unused.sum() > 50
    kv[unused] = float("nan")
    out = nan_empty(T, H, 512, device=device)
    got, max_logits, lse = sparse_mla_prefill(q, kv, idx, SCALE, sink, lens, out=out)
    report, ref_lse = _prefill_within_budget(f"prefill H{H}", got, q, kv, idx, sink, lens)
    # Reported, not gated: the original quoted a 4.8e-3 max abs bound for its prefill,
    # at its (unstated) input scale; our inputs reach |x| ~ 20.
    print(f"prefill H{H}: {report}")
    assert (got[4] == 0).all() and torch.isinf(lse[4]).all() and torch.isinf(max_logits[4]).all()
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(lse.cpu()[finite].double(), ref_lse[finite], atol=1e-3)
    # The max logit, against fp32 logits of the counted, real rows.
    for t in range(4):
        rows = idx[t, : lens[t]].cpu().long()
        rows = rows[(rows >= 0) & (rows < S)]
        if rows.numel() == 0:  # every counted entry a hole: no rows, -inf
            assert torch.isneginf(max_logits[t]).all(), t
            continue
        logits = (q[t].float().cpu() @ kv[rows].float().cpu().T) * SCALE  # [H, rows]
        want = logits.max(dim=1).values
        assert torch.allclose(max_logits[t].cpu(), want, rtol=1e-4, atol=1e-3), t
    assert (max_logits[:4].cpu() <= lse[:4].cpu() + 1e-4).all()


def test_prefill_all_holes_and_no_lengths(device, prefill_engine):
    q, kv, idx, _ = make_prefill_case(3, 16, 100, 128, 3, device)
    idx[1] = -1
    got, _, lse = sparse_mla_prefill(q, kv, idx, SCALE, None, None)
    _prefill_within_budget("prefill holes", got, q, kv, idx, None, None)
    assert (got[1] == 0).all() and torch.isinf(lse[1]).all()


def _prefill_mutant(q, kv, idx, sink, mutant):
    """(kernel inputs, mutate) making ``mutant`` of the prefill; it has no UE8M0 scales
    (its rows are bf16), so that mutant does not apply."""
    if mutant == "scale":
        return (q, kv, idx, sink), mutants.scale
    if mutant == "swap-heads":
        return (q, kv, idx, sink), mutants.swap_heads
    if mutant == "ignore-sink":
        return (q, kv, idx, mutants.ignore_sink(sink)), None
    if mutant == "drop-tile":
        return (q, kv, mutants.drop_tile(idx, tile=1), sink), None
    if mutant == "neighbour-row":  # token 0's heaviest row for head 0 read from the next
        S = kv.shape[0]
        entries = [e for e in range(idx.shape[1]) if 0 <= int(idx[0, e]) < S - 1]
        logits = kv[idx[0, entries].long()].double().cpu() @ q[0, 0].double().cpu()
        heaviest = entries[int(logits.argmax())]
        return (q, kv, mutants.read_neighbour(idx, 0, heaviest), sink), None
    raise ValueError(f"mutant {mutant!r} does not apply to the prefill")


PREFILL_MUTANTS = [m for m in mutants.MUTANTS if m != "ue8m0-exponent"]


@pytest.mark.parametrize("mutant", PREFILL_MUTANTS)
def test_prefill_budget_rejects_every_mutant(device, prefill_engine, mutant):
    """Three tokens of 128 entries (holes, rows past the workspace), 16 heads, sinks the
    softmax feels: the real kernel passes the budget, each mutant fails it."""
    q, kv, idx, _ = make_prefill_case(3, 16, 100, 128, 3, device)
    _, lse = sparse_mla_prefill_ref(q.cpu(), kv.cpu(), idx.cpu(), SCALE)
    # per head, the sink's weight from ~2 % to ~90 % in the token whose logits are smallest
    # (see _unmutated_decode)
    low = lse.amin(dim=0)
    sink = (low + torch.linspace(-4, 2, 16, dtype=torch.float64)).float().to(device)
    got, _, _ = sparse_mla_prefill(q, kv, idx, SCALE, sink)
    _prefill_within_budget("unmutated", got, q, kv, idx, sink, None)
    (mq, mkv, midx, msink), mutate = _prefill_mutant(q, kv, idx, sink, mutant)
    if any(a is not b for a, b in zip((mq, mkv, midx, msink), (q, kv, idx, sink), strict=True)):
        got, _, _ = sparse_mla_prefill(mq, mkv, midx, SCALE, msink)
    if mutate is not None:
        got = mutate(got)
    with pytest.raises(AssertionError, match=BUDGET_REJECTS):
        _prefill_within_budget(f"mutant {mutant}", got, q, kv, idx, sink, None)


@pytest.mark.gpu
def test_prefill_production_chunk(device, prefill_engine):
    q, kv, idx, sink = make_prefill_case(2048, 64, 20000, 640, 7, device)
    got, _, _ = sparse_mla_prefill(q, kv, idx, SCALE, sink)
    sub = slice(0, 2048, 97)  # the Python reference is slow: check a spread of tokens
    ref, _ = sparse_mla_prefill_ref(q[sub].cpu(), kv.cpu(), idx[sub].cpu(), SCALE, sink.cpu())
    torch_bf16, _ = sparse_mla_prefill_ref(
        q[sub].cpu(), kv.cpu(), idx[sub].cpu(), SCALE, sink.cpu(), precision="bf16"
    )
    assert_within_torch_budget("prefill chunk", got[sub].float().cpu(), ref, torch_bf16)


@pytest.mark.gpu
def test_prefill_is_batch_invariant_and_deterministic(device, prefill_engine):
    """A token's prefill output is the same bits alone, inside a batch of 64 other
    tokens, and run to run."""
    q, kv, idx, sink = make_prefill_case(65, 64, 5000, 640, 11, device)
    lens = torch.randint(1, 641, (65,), generator=torch.Generator().manual_seed(3)).int()
    lens = lens.to(device)
    batch, _, _ = sparse_mla_prefill(q, kv, idx, SCALE, sink, lens)
    again, _, _ = sparse_mla_prefill(q, kv, idx, SCALE, sink, lens)
    alone, _, _ = sparse_mla_prefill(q[40:41], kv, idx[40:41], SCALE, sink, lens[40:41])
    assert torch.equal(batch, again)
    assert torch.equal(batch[40:41], alone)


def test_errors_name_the_argument(device):
    case = make_decode_case(1, 64, extra_width=0, seed=0, device=device)
    with pytest.raises(ValueError, match=r"q: expected dtype torch\.bfloat16"):
        sparse_mla_decode(case.q.float(), case.cache, case.idx, case.lens, SCALE)
    with pytest.raises(ValueError, match=r"num_heads: expected 1\.\.64"):
        sparse_mla_decode(case.q, case.cache, case.idx, case.lens, SCALE, num_heads=65)
    with pytest.raises(ValueError, match="extra_k_cache and extra_indices"):
        sparse_mla_decode(case.q, case.cache, case.idx, case.lens, SCALE, extra_k_cache=case.cache)
    with pytest.raises(ValueError, match="topk_length: expected 1 entries"):
        sparse_mla_decode(case.q, case.cache, case.idx, case.lens.repeat(2), SCALE)
    with pytest.raises(ValueError, match="k_cache: expected contiguous 584-byte"):
        sparse_mla_decode(
            case.q,
            torch.zeros(2, 64, 528, dtype=torch.uint8, device=device),
            case.idx,
            case.lens,
            SCALE,
        )
    with pytest.raises(ValueError, match="attn_sink: needs >= 64"):
        sparse_mla_decode(
            case.q, case.cache, case.idx, case.lens, SCALE, attn_sink=torch.zeros(8, device=device)
        )
    assert math.isclose(SCALE, 0.044194173824159216)


def test_decode_engine_choice(monkeypatch, caplog):
    """auto: TileLang where it can run (CUDA, compute capability 8.0+, TileLang installed,
    no interpreter), else Triton -- with a warning when a GPU falls back; a forced engine
    that cannot run, or an unknown name, is refused with the variable and the reason."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(mla_engine.DECODE_ENGINE_ENV, raising=False)
    assert mla_engine.decode_engine(cpu) == "triton"
    monkeypatch.setattr(mla_engine, "INTERPRETING", False)
    capability = {"cc": (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability["cc"])
    assert mla_engine.decode_engine(cuda) == "tilelang"
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "triton")
    assert mla_engine.decode_engine(cuda) == "triton"
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    with pytest.raises(ValueError, match=r"=tilelang: it needs a CUDA device .*choose triton"):
        mla_engine.decode_engine(cpu)
    capability["cc"] = (7, 5)
    with pytest.raises(ValueError, match=r"compute capability 8\.0 or newer \(this GPU is 7\.5\)"):
        mla_engine.decode_engine(cuda)
    monkeypatch.delenv(mla_engine.DECODE_ENGINE_ENV)
    with caplog.at_level("WARNING", logger="deepinfer_sm80.sparse_mla"):
        assert mla_engine.decode_engine(cuda) == "triton"
    assert "runs the Triton kernel: it needs compute capability 8.0" in caplog.text
    capability["cc"] = (8, 6)
    monkeypatch.setattr(mla_engine.importlib.util, "find_spec", lambda name: None)
    monkeypatch.delitem(mla_engine.sys.modules, "tilelang", raising=False)
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "tilelang")
    with pytest.raises(ValueError, match="TileLang is not installed"):
        mla_engine.decode_engine(cuda)
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "flashmla")
    with pytest.raises(ValueError, match="expected one of auto, tilelang, triton"):
        mla_engine.decode_engine(cuda)


def test_prefill_engine_choice(monkeypatch):
    """DEEPINFER_SPARSE_MLA_PREFILL follows the decode switch's rules, on its own."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(mla_engine.PREFILL_ENGINE_ENV, raising=False)
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, "triton")
    assert mla_engine.prefill_engine(cpu) == "triton"
    monkeypatch.setattr(mla_engine, "INTERPRETING", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 6))
    assert mla_engine.prefill_engine(cuda) == "tilelang"  # not the decode's choice
    monkeypatch.setenv(mla_engine.PREFILL_ENGINE_ENV, "triton")
    assert mla_engine.prefill_engine(cuda) == "triton"
    monkeypatch.setenv(mla_engine.PREFILL_ENGINE_ENV, "tilelang")
    with pytest.raises(ValueError, match=r"DEEPINFER_SPARSE_MLA_PREFILL=tilelang: it needs"):
        mla_engine.prefill_engine(cpu)
    monkeypatch.setenv(mla_engine.PREFILL_ENGINE_ENV, "cutlass")
    with pytest.raises(ValueError, match=r"PREFILL='cutlass': expected one of auto"):
        mla_engine.prefill_engine(cuda)


def test_tilelang_prefill_variant_and_refusals():
    """The prefill variant is the wide kernel over one cache of bf16 rows with one split
    per token (index widths rounded up to whole 16-row tiles); misaligned workspaces and
    queries are refused before anything reaches the GPU, naming the way out."""
    from deepinfer_sm80.ops.sparse_mla import tilelang_kernels as td

    v = td.prefill_variant(600, has_len=True, has_sink=False)
    assert (v.main_width, v.rows_per_split, v.max_splits, v.bf16_rows) == (600, 608, 1, True)
    assert v.label == "sparse_mla.prefill_tl[600+0,r608,p1,nosink]"
    assert v.callee().endswith(", true>") and v.smem_bytes() < 48 * 1024
    # no scale or factor tables: 8 bytes of table per row instead of 31
    assert (
        td.prefill_variant(640, True, True).smem_bytes()
        < td.AttentionVariant(640, 0, True, True, 640).smem_bytes() - 23 * 640 + 64
    )
    narrow = td.prefill_variant(640, True, True, narrow=True)
    assert narrow.label == "sparse_mla.prefill_tl[640+0,r640,p1,h8]"
    assert narrow.callee().startswith("deepinfer_mla::attention_cta_narrow<640, 0,")
    assert narrow.smem_bytes() <= 48 * 1024  # 640 rows of records, no scale tables
    with pytest.raises(ValueError, match="bf16_rows: the prefill variant reads one cache"):
        td.AttentionVariant(128, 512, True, True, 640, bf16_rows=True)
    with pytest.raises(ValueError, match="bf16_rows"):
        td.AttentionVariant(640, 0, True, True, 192, bf16_rows=True)  # 4 splits
    q = torch.zeros(2, 16, 512, dtype=torch.bfloat16)
    lse = torch.zeros(2, 16)
    idx = torch.zeros(2, 640, dtype=torch.int32)
    flat = torch.zeros(100 * 512 + 8, dtype=torch.bfloat16)
    kv_odd = flat[1 : 1 + 100 * 512].view(100, 512)  # 2 bytes past an aligned allocation
    with pytest.raises(ValueError, match=r"kv: the TileLang prefill reads 16-byte pieces"):
        td.launch_prefill(q, q, lse, lse, kv_odd, idx, None, None, 1.0, 16)
    kv = torch.zeros(100, 512, dtype=torch.bfloat16)
    q_odd = torch.zeros(2 * 16 * 512 + 1, dtype=torch.bfloat16)[1:].view(2, 16, 512)
    with pytest.raises(ValueError, match=r"q: .*DEEPINFER_SPARSE_MLA_PREFILL=triton"):
        td.launch_prefill(q_odd, q, lse, lse, kv, idx, None, None, 1.0, 16)


def test_inputs_on_another_device_are_refused(device):
    """The TileLang path passes raw addresses: a tensor on another device must be refused
    up front (here: the meta device), never turned into a wild address."""
    case = make_decode_case(1, 64, seed=0, device=device)
    meta = torch.device("meta")
    with pytest.raises(ValueError, match=r"k_cache: expected a tensor on"):
        sparse_mla_decode(case.q, case.cache.to(meta), case.idx, case.lens, SCALE)
    with pytest.raises(ValueError, match=r"topk_length: expected a tensor on"):
        sparse_mla_decode(case.q, case.cache, case.idx, case.lens.to(meta), SCALE)
    with pytest.raises(ValueError, match=r"attn_sink: expected a tensor on"):
        sparse_mla_decode(case.q, case.cache, case.idx, case.lens, SCALE, case.sink.to(meta))
    strided_lens = torch.zeros(4, dtype=torch.int32, device=device)[::2]  # 2 entries, stride 2
    with pytest.raises(ValueError, match=r"topk_length: expected contiguous entries"):
        sparse_mla_decode(
            case.q.repeat(2, 1, 1), case.cache, case.idx.repeat(2, 1), strided_lens, SCALE
        )


def test_the_two_copies_of_the_fp8_decode_ptx_are_the_same():
    """attention_sm80.cuh carries the packed e4m3 x UE8M0 -> bf16 PTX that ops/fp8 tests
    bit-exactly against torch for all 256 bytes x 256 scales; the copies must not drift."""
    import re
    from pathlib import Path

    from deepinfer_sm80.ops.fp8 import triton_fp8

    cuh = (Path(mla_kernels.__file__).with_name("attention_sm80.cuh")).read_text()
    body = cuh[cuh.index("e4m3x4_to_bf16x4(") :]
    asm_lines = re.findall(r'"([^"]*)\\n"', body[: body.index(': "=r"(lo)')])
    cuda_ptx = [re.sub(r"%(\d)", r"$\1", line).strip() for line in asm_lines]
    triton_ptx = [
        line.strip() for line in triton_fp8._E4M3X4_UE8M0_TO_BF16_PTX.value.strip().splitlines()
    ]
    assert len(cuda_ptx) > 20 and cuda_ptx == triton_ptx


@pytest.fixture(scope="module")
def sparse_mla_aot_build(tmp_path_factory):
    """The image's AOT step for these kernels (``aot.build_sparse_mla`` for sm_80 and sm_86),
    run once for the tests that read it: its manifest and folder."""
    from tilelang.cache import _dispatch_map

    from deepinfer_sm80 import aot

    dest = tmp_path_factory.mktemp("sparse_mla_aot")
    with pytest.MonkeyPatch.context() as mp:
        # Kernels this process already compiled would come from TileLang's memory caches
        # and never reach the new folder; the image build is a fresh process.
        for cache in _dispatch_map.values():
            mp.setattr(cache, "_memory_cache", {})
        return aot.build_sparse_mla(dest, [80, 86]), dest


@pytest.mark.aot
def test_tilelang_kernels_fit_ampere(sparse_mla_aot_build):
    """Every shipped TileLang variant (decode: 3 index widths, and the throughput split;
    prefill: 2 widths over bf16 rows; each with the wide and the narrow kernel) compiles
    for sm_80 and sm_86 within 48 KB of shared memory, without spills, and leaves room
    for two 256-thread CTAs per SM. (Measured by the AOT build, which compiles each variant
    through ``tilelang_build.fit_report`` as ``fit_reports()`` does.)"""
    from deepinfer_sm80.ampere_fit import fit_violations, format_reports
    from deepinfer_sm80.kernel_spec import FitReport
    from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import shipped_variants

    manifest, _ = sparse_mla_aot_build
    fields = {f.name for f in dataclasses.fields(FitReport)}
    reports = [FitReport(**{k: v for k, v in row.items() if k in fields})
               for row in manifest["kernels"]]  # fmt: skip
    print(format_reports(reports))
    assert [r.label for r in reports] == [v.label for v in shipped_variants()] * 2
    assert len(reports) == 24
    assert fit_violations(reports) == []
    assert all(r.min_ctas_per_sm == 2 and r.threads == 256 for r in reports)


@pytest.mark.aot
def test_splits_fastest_grid_fits_ampere(monkeypatch):
    """arch.py SPLITS_FASTEST=1: the decode variants of V4.1's 128 + 512 rows (latency and
    throughput split sizes, wide and narrow kernels) are built in that order and fit
    sm_80 and sm_86 as the shipped order does."""
    import dataclasses as dc

    from deepinfer_sm80 import tilelang_build
    from deepinfer_sm80.ampere_fit import fit_violations, format_reports

    _with_splits_fastest(monkeypatch, True)
    variants = [
        v
        for v in tilelang_kernels.shipped_variants()
        if not v.bf16_rows and (v.main_width, v.extra_width) == (128, 512)
    ]
    assert len(variants) == 4 and all(v.splits_fastest for v in variants)
    assert {v.label for v in variants}.isdisjoint(
        dc.replace(v, splits_fastest=False).label for v in variants
    )
    reports = tilelang_build.fit_reports(variants, (80, 86))
    print(format_reports(reports))
    assert len(reports) == 8 and fit_violations(reports) == []
    assert all(r.min_ctas_per_sm == 2 and r.threads == 256 for r in reports)


@pytest.mark.aot
def test_tilelang_kernels_aot_build_and_refusal(sparse_mla_aot_build, tmp_path, monkeypatch):
    """The image's AOT step for these kernels (``aot.build_sparse_mla``, part of ``python -m
    deepinfer_sm80.aot build``): a TileLang cache folder and a manifest for both arches; a
    misfit (here: forced) fails the build with the kernel named."""
    import json

    from tilelang.cache import _dispatch_map

    from deepinfer_sm80 import aot

    built, folder = sparse_mla_aot_build
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest == built
    assert manifest["arches"] == ["sm_80", "sm_86"] and len(manifest["kernels"]) == 24
    assert all(k["error"] is None for k in manifest["kernels"])
    assert any((folder / "tilelang").rglob("*")), "no TileLang cache entries written"
    # Three CTAs per SM caps the wide kernel's registers at 80: it spills. The wide decode
    # kernel of V4.1's 128 + 512 rows alone is built.
    for cache in _dispatch_map.values():
        monkeypatch.setattr(cache, "_memory_cache", {})
    _with_decode_constexpr(monkeypatch, "CTAS_PER_SM", 3)
    wide = [
        v
        for v in tilelang_kernels.shipped_variants()
        if v.label.startswith("sparse_mla.decode_tl[128+512") and not v.label.endswith(",h8]")
    ][:1]
    assert wide
    monkeypatch.setattr(tilelang_kernels, "shipped_variants", lambda: wide)
    with pytest.raises(RuntimeError, match=r"decode_tl\[128\+512[^\n]* on sm_80: spills"):
        aot.build_sparse_mla(tmp_path / "bad", [80])


@pytest.mark.aot
@pytest.mark.parametrize("kind", ["wide", "narrow", "narrow-register", "prefill", "prefill-narrow"])
def test_tilelang_kernels_refuse_a_too_small_shared_buffer(monkeypatch, kind):
    """attention_sm80.cuh's static_assert ties its Smem struct to smem_bytes(), the size
    TileLang allocates: a formula that undercounts fails the build instead of overrunning
    shared memory. The shipped size compiles (test_tilelang_kernels_fit_ampere)."""
    from deepinfer_sm80.ops.sparse_mla import tilelang_kernels
    from deepinfer_sm80.tilelang_build import cuda_target, get_kernel

    # A split size nothing else compiles: this process's kernel cache cannot answer.
    if kind.startswith("prefill"):
        variant = tilelang_kernels.prefill_variant(176, True, True, narrow=kind.endswith("narrow"))
    else:
        rows = 336 if kind == "narrow-register" else 176  # 336: the register path for PV
        variant = tilelang_kernels.AttentionVariant(
            128, 512, True, True, rows, narrow=kind.startswith("narrow")
        )
        assert variant.register_pv == (kind == "narrow-register")
    real = tilelang_kernels.AttentionVariant.smem_bytes
    monkeypatch.setattr(tilelang_kernels.AttentionVariant, "smem_bytes", lambda v: real(v) - 8)
    with pytest.raises(Exception, match=r"smem_bytes\(\) is smaller than Smem"):
        get_kernel(variant, cuda_target(80))


def test_tilelang_launch_refuses_what_its_kernel_cannot_take(monkeypatch):
    """Checked before anything reaches the GPU: q/out must be 4-byte aligned with even
    strides (the kernel moves bf16 pairs), and arch.py's BLOCK_H/BLOCK_N must state the
    kernel's fixed 16 x 16 tile."""
    from deepinfer_sm80.ops.sparse_mla import tilelang_kernels

    flat = torch.zeros(2 * 64 * 512 + 1, dtype=torch.bfloat16)
    odd = flat[1:].view(2, 64, 512)  # 2-byte offset
    good = torch.zeros(2, 64, 512, dtype=torch.bfloat16)
    args = (None,) * 8 + (1.0, 64, 128, 1, None, None)
    with pytest.raises(ValueError, match=r"q: the TileLang decode needs a 4-byte-aligned"):
        tilelang_kernels.launch(odd, good, *args)
    with pytest.raises(ValueError, match=r"out: .*DEEPINFER_SPARSE_MLA_DECODE=triton"):
        tilelang_kernels.launch(good, odd, *args)
    cfg = arch.KERNEL_CONFIGS["sparse_mla.decode_tilelang"]
    consts = {**cfg.constexpr_dict(), "BLOCK_N": 32}
    monkeypatch.setitem(
        arch.KERNEL_CONFIGS,
        "sparse_mla.decode_tilelang",
        dataclasses.replace(cfg, constexprs=tuple(consts.items())),
    )
    with pytest.raises(ValueError, match=r"BLOCK_H/BLOCK_N are the kernel's fixed tile"):
        tilelang_kernels.launch(good, good, *args)


@pytest.mark.parametrize("heads", [1, 5, 8, 9, 16, 64])
def test_tilelang_launch_picks_the_kernel_by_head_count(monkeypatch, heads):
    """8 heads per rank or fewer run the narrow kernel (one tile in flight, whatever
    arch.py's PREFETCH); more run the wide one. The head count is fixed per deployment,
    so a token's kernel -- and its bits -- never depend on the batch. Checked without a
    GPU: the variant that would be compiled is captured."""
    from deepinfer_sm80.ops.sparse_mla import tilelang_kernels

    picked = []
    monkeypatch.setattr(
        tilelang_kernels, "get_kernel", lambda v: picked.append(v) or (lambda *a: None)
    )
    q = torch.zeros(2, 64, 512, dtype=torch.bfloat16)
    cache = torch.zeros(3, 64, 584, dtype=torch.uint8)
    idx = torch.zeros(2, 128, dtype=torch.int32)
    lens = torch.zeros(2, dtype=torch.int32)
    tilelang_kernels.launch(
        q, q, None, cache, idx, lens, None, None, None, None, 1.0, heads, 192, 2, q, q
    )
    (variant,) = picked
    assert variant.narrow == (heads <= 8)
    assert variant.heads_per_cta == (8 if heads <= 8 else 16)
    assert variant.prefetch == (1 if heads <= 8 else 2)
    assert variant.smem_bytes() <= 48 * 1024
    assert ("attention_cta_narrow<" in variant.callee()) == (heads <= 8)
    with pytest.raises(ValueError, match=r"prefetch: the narrow kernel keeps 1 tile"):
        tilelang_kernels.AttentionVariant(128, 512, True, True, 192, prefetch=2, narrow=True)
