"""ops/mhc: TileLang mHC boundary kernels (fused post + delayed pre; post + sum of squares).

CPU tier: ``ref.py`` against vLLM 0.33.0's PyTorch oracle (``model_executor/kernels/mhc/
torch.py``), signatures against vLLM's, argument errors, the geometry and variant list, and
(``aot``) every shipped variant compiled for sm_80 and sm_86 with registers, spills and
shared memory read from ptxas / TileLang, plus the AOT cache being what a server on that
architecture looks up. TileLang kernels cannot run on a CPU, so every kernel-vs-reference
case is ``gpu``; those import nothing from vLLM (the GPU machine has none).
"""

import dataclasses
import inspect
import os

import pytest
import torch

from deepinfer_sm80.ops.mhc import mhc_fused_post_pre_delayed, mhc_post, mhc_post_with_sqrsum
from deepinfer_sm80.ops.mhc.geometry import (
    HIDDEN,
    N_SPLITS,
    SMALL_TOKEN_GROUPS,
    TC_MIN_TOKENS,
    choose_path,
    slice_width,
)
from deepinfer_sm80.ops.mhc.inputs import MODEL_SCALARS, NORM_EPS, model_like_inputs
from deepinfer_sm80.ops.mhc.ref import fused_post_pre_delayed_ref, post_fixed_order
from tools import mutants
from tools.compare import assert_within_torch_budget

FP32_ATOL = 1.9e-3  # pre, post, comb vs the fp64 reference
ORIGINAL_PREFILL_ATOL = 4.8e-3  # the original's prefill bound, reported alongside
PRODUCTION_TOKENS = [1, 6, 12, 15, 16, 17, 32, 128, 1024]


def _vllm_module(name):
    if os.environ.get("DEEPINFER_REQUIRE_VLLM") == "1":
        import importlib

        return importlib.import_module(name)
    return pytest.importorskip(name)


def _call(fn, inp, *, pre_mix=True, norm=True, capture_aux=False, **kw):
    return fn(
        *inp.positional(),
        pre_mix=inp.pre_mix if pre_mix else None,
        norm_weight=inp.norm_weight if norm else None,
        norm_eps=NORM_EPS,
        capture_aux=capture_aux,
        **kw,
    )


# ----------------------------------------------------------------- CPU: reference vs vLLM


@pytest.mark.vllm
def test_signatures_equal_vllm():
    tl = _vllm_module("vllm.model_executor.kernels.mhc.tilelang")
    ours = inspect.signature(mhc_fused_post_pre_delayed, eval_str=True)
    theirs = inspect.signature(tl.mhc_fused_post_pre_delayed_tilelang, eval_str=True)
    assert ours == theirs
    assert inspect.signature(mhc_post, eval_str=True) == inspect.signature(
        tl.mhc_post_tilelang, eval_str=True
    )


@pytest.mark.vllm
@pytest.mark.parametrize("num_tokens", [1, 5, 17])
@pytest.mark.parametrize("with_pre_mix", [True, False])
def test_reference_equals_vllm_torch_oracle(num_tokens, with_pre_mix):
    """ref.py = vLLM's mhc_post_torch then mhc_pre_delayed_torch on the bf16 residual."""
    oracle = _vllm_module("vllm.model_executor.kernels.mhc.torch")
    inp = model_like_inputs(num_tokens, seed=num_tokens)
    pre = inp.pre_mix if with_pre_mix else None
    ours = fused_post_pre_delayed_ref(*inp.positional(), pre_mix=pre, norm_weight=None)
    residual_cur = oracle.mhc_post_torch(inp.x, inp.residual, inp.post_layer_mix, inp.comb_res_mix)
    post, comb, layer_input, next_pre = oracle.mhc_pre_delayed_torch(
        residual_cur, inp.fn, inp.hc_scale, inp.hc_base, *inp.positional()[7:], pre_mix=pre
    )
    assert torch.equal(ours[0], residual_cur)
    # Same formulas, same op order: the fp32 coefficients agree to the last bits.
    torch.testing.assert_close(ours[1], post, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[2], comb, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[4], next_pre, rtol=0, atol=1e-6)
    assert torch.equal(ours[3], layer_input)


@pytest.mark.vllm
def test_fixed_order_post_reference_is_within_one_ulp_of_vllm():
    oracle = _vllm_module("vllm.model_executor.kernels.mhc.torch")
    inp = model_like_inputs(9, seed=3)
    out, sqrsum = post_fixed_order(inp.x, inp.residual, inp.post_layer_mix, inp.comb_res_mix)
    theirs = oracle.mhc_post_torch(inp.x, inp.residual, inp.post_layer_mix, inp.comb_res_mix)
    diff = (out.view(torch.int16).int() - theirs.view(torch.int16).int()).abs()
    assert int(diff.max()) <= 1  # adjacent bf16 values at most (different fp32 op order)
    torch.testing.assert_close(sqrsum, out.float().square().sum(dim=(1, 2)))


def test_bf16_yardstick_is_coarser_than_the_fp32_reference():
    """The bf16 budget is measured against PyTorch-in-bf16, which must err visibly."""
    inp = model_like_inputs(4, seed=1)
    ref = _call(fused_post_pre_delayed_ref, inp)
    bf16 = _call(fused_post_pre_delayed_ref, inp, dtype=torch.bfloat16)
    assert not torch.equal(ref[3], bf16[3])
    assert (ref[2] - bf16[2]).abs().max() > FP32_ATOL / 100


# ----------------------------------------------------------------- CPU: geometry, errors


def test_split_geometry_is_eight_slices_of_640():
    assert N_SPLITS == 8 and slice_width(HIDDEN) == 640 and 640 % 128 == 0
    assert choose_path(TC_MIN_TOKENS - 1) == "small" and choose_path(TC_MIN_TOKENS) == "tensor_core"
    from deepinfer_sm80.ops.mhc.geometry import small_config

    assert [small_config(t).token_group for t in (1, 2, 3, 15)] == [1, 2, 3, 3]


def test_shipped_variants_cover_every_token_count():
    from deepinfer_sm80.ops.mhc.ops import fused_variant
    from deepinfer_sm80.ops.mhc.warmup import shipped_variants

    for budget in (1, 12, 100, 8192):
        shipped = set(shipped_variants(budget))
        for t in range(1, budget + 1):
            assert fused_variant(t, HIDDEN, 4) in shipped, (budget, t)
    # small buckets + the Tensor Core kernel + two epilogues (8 / 40 partial rows) + post
    assert len(shipped_variants(8192)) == len(SMALL_TOKEN_GROUPS) + 4


def test_tensor_core_tile_fills_write_every_element_once():
    """The stage-tile fills of the shipped Tensor Core config are one-to-one (the proof
    behind TileLang's "written by multiple threads" warning being a false positive), and
    the check rejects fills with a repeat, a gap or a write outside the tile."""
    from deepinfer_sm80.ops.mhc import tilelang_kernels as k
    from deepinfer_sm80.ops.mhc.geometry import mix_size, tensor_core_config

    cfg = tensor_core_config(64)
    hc, mix, bm, bh, threads = 4, mix_size(4), cfg.block_m, cfg.block_h, cfg.threads
    k.check_tile_fill("res_s", k.residual_tile_coords, (hc, bh), bm * hc * bh // 8, 8, (bm, hc, bh))
    k.check_tile_fill("x_s", k.x_tile_coords, (bh,), bm * bh // 2, 2, (bm, bh))
    k.check_tile_fill("w_s", k.weight_tile_coords, (mix, bh), hc * mix * bh // 4, 4, (mix, hc, bh))
    assert threads % 32 == 0

    def repeats(q, v, mix, block_h):  # every stream's rows written over stream 0's
        row, _, h = k.weight_tile_coords(q, v, mix, block_h)
        return row, 0, h

    def wrong_row(q, v, mix, block_h):  # rows shifted by one: the last falls off the tile
        row, stream, h = k.weight_tile_coords(q, v, mix, block_h)
        return row + 1, stream, h

    vectors = hc * mix * bh // 4
    with pytest.raises(AssertionError, match="a repeat or a gap"):
        k.check_tile_fill("w_s", repeats, (mix, bh), vectors, 4, (mix, hc, bh))
    with pytest.raises(AssertionError, match="outside"):
        k.check_tile_fill("w_s", wrong_row, (mix, bh), vectors, 4, (mix, hc, bh))
    with pytest.raises(AssertionError, match="a repeat or a gap"):  # one vector short
        k.check_tile_fill("w_s", k.weight_tile_coords, (mix, bh), vectors - 1, 4, (mix, hc, bh))


def test_zero_tokens_returns_empty_outputs_without_a_launch():
    inp = model_like_inputs(0)
    out = _call(mhc_fused_post_pre_delayed, inp, capture_aux=True)
    shapes = [tuple(t.shape) for t in out]
    assert shapes == [(0, 4, HIDDEN), (0, 4, 1), (0, 4, 4), (0, HIDDEN), (0, 4), (0, HIDDEN)]
    res, sq = mhc_post_with_sqrsum(inp.x, inp.residual, inp.post_layer_mix, inp.comb_res_mix)
    assert res.shape == (0, 4, HIDDEN) and sq.shape == (0,)


@pytest.mark.parametrize(
    "change,fragment",
    [
        (lambda a: a.update(x=a["x"].float()), "x: expected dtype torch.bfloat16"),
        (
            lambda a: a.update(fn=a["fn"][:, :-8].contiguous()),
            "fn: expected a contiguous (24, 20480)",
        ),
        (lambda a: a.update(comb_res_mix=a["comb_res_mix"][:, :3]), "comb_res_mix"),
        (lambda a: a.update(hc_base=a["hc_base"][:5]), "hc_base: expected shape (24,)"),
        (lambda a: a.update(pre_mix=a["pre_mix"].double()), "pre_mix: expected dtype"),
        (lambda a: a.update(norm_weight=a["norm_weight"][:7]), "norm_weight"),
        (
            lambda a: a.update(
                residual=a["residual"][:, :, :1000].contiguous(), x=a["x"][:, :1000].contiguous()
            ),
            "unsupported shape: a slice of 125 elements",
        ),
        (lambda a: a.update(sinkhorn_repeat=0), "sinkhorn_repeat"),
    ],
)
def test_errors_name_the_argument(change, fragment):
    inp = model_like_inputs(2)
    names = list(inspect.signature(mhc_fused_post_pre_delayed).parameters)
    args = dict(zip(names, inp.positional(), strict=False))
    args.update(pre_mix=inp.pre_mix, norm_weight=inp.norm_weight)
    change(args)
    with pytest.raises(ValueError, match=None) as info:
        mhc_fused_post_pre_delayed(**args)
    assert fragment in str(info.value), str(info.value)


# ----------------------------------------------------------------- CPU: AOT for sm_80/sm_86


@pytest.fixture(scope="module")
def aot_dir(tmp_path_factory):
    from deepinfer_sm80.aot import build_mhc

    dest = tmp_path_factory.mktemp("mhc_aot")
    manifest = build_mhc(dest, [80, 86], max_num_batched_tokens=8192, log=print)
    return dest, manifest


@pytest.mark.aot
def test_aot_every_shipped_variant_fits_ampere(aot_dir):
    """The image's mHC AOT step (``aot.build_mhc``) raises on any violation; the manifest
    records the token budget, the model constants and every build's resources."""
    from deepinfer_sm80.arch import STATIC_SMEM_LIMIT_BYTES
    from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig, shipped_variants

    _, manifest = aot_dir
    assert manifest["arches"] == ["sm_80", "sm_86"] and manifest["max_num_batched_tokens"] == 8192
    assert manifest["model"] == dataclasses.asdict(MhcModelConfig())
    rows = manifest["kernels"]
    labels = {v.label for v in shipped_variants(8192)}
    assert {(r["label"], r["arch"]) for r in rows} == {
        (label, arch) for label in labels for arch in ("sm_80", "sm_86")
    }
    for r in rows:
        assert r["error"] is None, r
        assert 0 < r["shared_bytes"] <= STATIC_SMEM_LIMIT_BYTES, r
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
        assert r["registers"] * r["threads"] <= 65536, r


@pytest.mark.aot
@pytest.mark.parametrize("arch", ["sm_80", "sm_86"])
def test_aot_cache_is_what_a_server_on_that_arch_loads(aot_dir, arch, monkeypatch):
    """With TileLang's detector reporting ``arch``, every shipped variant loads from the
    AOT folder: compiling is made to fail, so a cache miss would raise."""
    import tilelang.cuda.target as cuda_target
    from tilelang.jit.kernel import JITKernel

    from deepinfer_sm80 import tilelang_build
    from deepinfer_sm80.ops.mhc.warmup import prepare_mhc_kernels

    dest, _ = aot_dir
    live = dest.parent / f"live_cache_{arch}"
    assert tilelang_build.seed_tilelang_cache(dest, live) > 0
    assert tilelang_build.seed_tilelang_cache(dest, live) == 0  # never overwrites
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(live))
    monkeypatch.setattr(cuda_target, "_detect_torch_cuda_arch", lambda: arch)
    monkeypatch.setattr(cuda_target, "check_cuda_availability", lambda: True)

    def no_compile(self, *args, **kwargs):
        raise AssertionError("a shipped variant was compiled instead of loaded from the AOT cache")

    monkeypatch.setattr(JITKernel, "_compile_and_create_adapter", no_compile)
    for cache in _tilelang_memory_caches():
        monkeypatch.setattr(cache, "_memory_cache", {})
    tilelang_build.forget_compiled()
    try:
        records = prepare_mhc_kernels(8192, log=print)
    finally:
        tilelang_build.forget_compiled()
    assert len(records) == len(SMALL_TOKEN_GROUPS) + 4


def _tilelang_memory_caches():
    from tilelang.cache import _dispatch_map

    return list(_dispatch_map.values())


# ----------------------------------------------------------------- GPU: kernels vs reference


def _assert_fp32(name, got, ref, atol=FP32_ATOL):
    assert not torch.isnan(got).any(), f"{name}: NaN"
    err = float((got.double() - ref.double()).abs().max())
    print(f"{name}: max abs {err:.2e} (bound {atol:.1e}; original prefill {ORIGINAL_PREFILL_ATOL})")
    assert err <= atol, f"{name}: max abs error {err:.3e} > {atol:.1e}"


def _check_against_reference(inp, got, **flags):
    ref = _call(fused_post_pre_delayed_ref, inp, dtype=torch.float64, **flags)
    bf16 = _call(fused_post_pre_delayed_ref, inp, dtype=torch.bfloat16, **flags)
    for i, name in ((1, "post"), (2, "comb"), (4, "next_pre")):
        _assert_fp32(name, got[i], ref[i])
    for i, name in ((0, "residual_cur"), (3, "layer_input"), (5, "aux")):
        if ref[i].numel():
            rep = assert_within_torch_budget(name, got[i].float(), ref[i].float(), bf16[i].float())
            print(name, rep)
    assert got[5].shape == ref[5].shape


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", PRODUCTION_TOKENS)
def test_fused_matches_reference_at_production_shapes(device, num_tokens):
    inp = model_like_inputs(num_tokens, device, seed=num_tokens)
    got = _call(mhc_fused_post_pre_delayed, inp)
    _check_against_reference(inp, got)


# The standard mutants (tools/mutants.py) that apply to mHC: no KV tiles, sinks or
# UE8M0 scales here; the 4 residual streams are its heads. TileLang kernels do not run
# on a CPU, so these are GPU-tier tests like the cases above.
MHC_MUTANTS = ["scale", "neighbour-row", "swap-heads"]
CHECK_REJECTS = r"outside the per-element bound|relative L2 error|max abs error"


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", MHC_MUTANTS)
def test_reference_check_rejects_every_mutant(device, mutant):
    """T=12 (the fused CUDA-core kernel): the kernel passes _check_against_reference,
    each mutant of it fails there."""
    inp = model_like_inputs(12, device, seed=12)
    got = _call(mhc_fused_post_pre_delayed, inp)
    _check_against_reference(inp, got)
    if mutant == "neighbour-row":  # token 0 reads token 1's residual rows
        shifted = model_like_inputs(12, device, seed=12)
        shifted.residual[0] = shifted.residual[1]
        got = _call(mhc_fused_post_pre_delayed, shifted)
    else:
        change = mutants.scale if mutant == "scale" else mutants.swap_heads  # streams 0, 1
        got = (change(got[0]), *got[1:])  # residual_cur
    with pytest.raises(AssertionError, match=CHECK_REJECTS):
        _check_against_reference(inp, got)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [6, 33])
@pytest.mark.parametrize(
    "flags",
    [
        {"pre_mix": False, "norm": True},
        {"pre_mix": True, "norm": False},
        {"pre_mix": True, "norm": True, "capture_aux": True},
    ],
)
def test_fused_variants_pre_mix_norm_aux(device, num_tokens, flags):
    inp = model_like_inputs(num_tokens, device, seed=7)
    got = _call(mhc_fused_post_pre_delayed, inp, **flags)
    _check_against_reference(inp, got, **flags)


@pytest.mark.gpu
@pytest.mark.parametrize("small,large", [(3, 12), (6, 15), (16, 40), (130, 1024), (20, 600)])
def test_batch_invariant_and_deterministic(device, small, large):
    """A token's outputs do not depend on the batch around it (same kernel path), and a
    rerun gives the same bits."""
    inp = model_like_inputs(large, device, seed=11)
    full = _call(mhc_fused_post_pre_delayed, inp)
    again = _call(mhc_fused_post_pre_delayed, inp)
    for a, b in zip(full, again, strict=True):
        assert torch.equal(a, b)
    head = model_like_inputs(large, device, seed=11)
    for f in ("x", "residual", "post_layer_mix", "comb_res_mix", "pre_mix"):
        setattr(head, f, getattr(head, f)[:small].contiguous())
    part = _call(mhc_fused_post_pre_delayed, head)
    for a, b in zip(part, full, strict=True):
        if a.numel():
            assert torch.equal(a, b[:small])


@pytest.mark.gpu
def test_nan_rows_stay_in_their_rows(device):
    """CUDA-graph padding rows may hold NaN; the other rows must not see it."""
    inp = model_like_inputs(20, device, seed=5)
    inp.residual[7] = float("nan")
    got = _call(mhc_fused_post_pre_delayed, inp)
    clean = [i for i in range(20) if i != 7]
    for t in got[:5]:
        assert not torch.isnan(t[clean]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 7, 128, 1024])
def test_post_with_sqrsum_is_bit_exact(device, num_tokens):
    inp = model_like_inputs(num_tokens, device, seed=num_tokens + 1)
    args = (inp.x, inp.residual, inp.post_layer_mix, inp.comb_res_mix)
    out, sqrsum = mhc_post_with_sqrsum(*args)
    ref_out, ref_sq = post_fixed_order(*args)
    assert torch.equal(out.view(torch.int16), ref_out.view(torch.int16))
    torch.testing.assert_close(sqrsum, ref_sq, rtol=2e-6 * (4 * HIDDEN) ** 0.5, atol=0)
    assert torch.equal(mhc_post(*args).view(torch.int16), ref_out.view(torch.int16))


@pytest.mark.gpu
def test_scalars_are_the_models():
    assert MODEL_SCALARS["sinkhorn_repeat"] == 20 and MODEL_SCALARS["hc_post_mult_value"] == 2.0
