"""ops/indexer_q: index-Q RoPE + fp8 quantization, bit-exact against ref.py and vLLM's kernel.

vLLM's Triton kernel runs on CPU under the interpreter (conftest), but the interpreter
truncates fp32 -> bf16 and drops mantissa carries in fp32 -> e4m3, so on its own it is
not a byte oracle. ``gpu_casts_in_interpreter`` swaps those conversions for PyTorch's
round-to-nearest-even (what the GPU's ``cvt.rn`` instructions do); vLLM's kernel, run
that way, must then equal ours byte for byte.
"""

import contextlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

from deepinfer_sm80.ops.indexer_q import fused_indexer_q_rope_quant
from deepinfer_sm80.ops.indexer_q.ref import indexer_q_rope_quant_ref
from deepinfer_sm80.ops.indexer_q.triton_kernel import (
    ampere_kernel_specs,
    launch_indexer_q_rope_quant,
)
from deepinfer_sm80.ops.rope.ref import fma_f32_ref, rope_rows
from tools.poison import nan_empty
from tools.tiers import skip_not_applicable

# DeepSeek-V4.1 indexer: index_head_dim 128 with qk_rope_head_dim 64 (nope 64).
# index_n_heads: 32 in the published config (some model descriptions say 64): both are tested.
HEAD_DIM = 128
ROPE_DIM = 64
SOFTMAX_SCALE = HEAD_DIM**-0.5
VLLM_FIQ = "vllm.models.deepseek_v4.common.ops.fused_indexer_q"


def vllm_module(name: str):
    if os.environ.get("DEEPINFER_REQUIRE_VLLM") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)


@contextlib.contextmanager
def gpu_casts_in_interpreter():
    """Make Triton's interpreter convert fp32/bf16/fp16/e4m3 like a GPU (RNE, e4m3
    saturating at 448), so vLLM's own kernels become byte oracles on CPU."""
    from triton.runtime import interpreter

    original = interpreter._convert_float
    torch_types = {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8e4nv": torch.float8_e4m3fn,
    }
    int_of_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
    np_uint = {1: np.uint8, 2: np.uint16, 4: np.uint32}

    def convert(values, src_type, dst_type, rounding_mode):
        src, dst = torch_types.get(src_type.name), torch_types.get(dst_type.name)
        if src is None or dst is None:
            return original(values, src_type, dst_type, rounding_mode)
        raw = np.frombuffer(values.tobytes(), dtype=np_uint[src.itemsize]).copy()
        x = torch.from_numpy(raw).view(int_of_size[src.itemsize]).view(src)
        if dst == torch.float8_e4m3fn:
            x = x.float()
            x = torch.where(torch.isnan(x), x, x.clamp(-448.0, 448.0))
        y = x.to(dst).view(int_of_size[dst.itemsize]).numpy()
        return y.view(np_uint[dst.itemsize]).reshape(values.shape)

    interpreter._convert_float = convert
    try:
        yield
    finally:
        interpreter._convert_float = original


def rope_cache(max_pos: int, theta: float = 10000.0) -> torch.Tensor:
    """cos || sin rows as vLLM's DeepseekV4 RoPE stores them (fp32, GPT-J pairs)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, ROPE_DIM, 2, dtype=torch.float32) / ROPE_DIM)
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


_CACHE = rope_cache(70_000)


def make_case(num_tokens: int, num_heads: int, seed: int, head_dim: int = HEAD_DIM, device="cpu"):
    """Queries with a wide per-head dynamic range (tiny heads hit the 1e-4 amax floor),
    outliers, an all-zero head and one head whose amax is exactly 448 * 2**3."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=g)
    q *= torch.logspace(-7, 4, num_heads)[None, :, None]
    spikes = torch.rand(q.shape, generator=g) < 0.01
    q = torch.where(spikes, q * 30, q)
    if num_heads > 2:
        q[:, 0] = 0.0
        q[:, 1].clamp_(-100, 100)
        q[:, 1, 3] = 448.0 * 8  # nope dim: the head amax, exactly on a scale boundary
    positions = torch.randint(0, _CACHE.shape[0], (num_tokens,), generator=g)
    if num_tokens > 1:
        positions[:2] = torch.tensor([0, 65535])
    weights = torch.randn(num_tokens, num_heads, generator=g)
    return (
        positions.to(device),
        q.to(torch.bfloat16).to(device),
        _CACHE.to(device),
        weights.to(torch.bfloat16).to(device),
        SOFTMAX_SCALE,
        num_heads**-0.5,
    )


def assert_same(q_fp8, weights_out, want_bytes, want_weights):
    got = q_fp8.view(torch.uint8) if q_fp8.dtype == torch.float8_e4m3fn else q_fp8
    diff = (got != want_bytes).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at {diff[0].tolist()}"
    same = weights_out.view(torch.int32) == want_weights.view(torch.int32)
    assert same.all(), f"{int((~same).sum())} weights differ, first {(~same).nonzero()[0]}"


# ------------------------------------------------------------------ against ref.py


@pytest.mark.parametrize("num_heads", [32, 64])
@pytest.mark.parametrize("num_tokens", [1, 3, 37])
def test_bytes_and_weights_equal_ref(device, num_tokens, num_heads):
    args = make_case(num_tokens, num_heads, seed=num_tokens * 100 + num_heads, device=device)
    q_fp8, weights_out = fused_indexer_q_rope_quant(*args)
    want_bytes, want_weights, _ = indexer_q_rope_quant_ref(*args, contract=device.type == "cuda")
    assert q_fp8.dtype == torch.float8_e4m3fn and weights_out.dtype == torch.float32
    assert_same(q_fp8, weights_out, want_bytes, want_weights)


@pytest.mark.parametrize(
    "num_heads,head_dim", [(1, HEAD_DIM), (8, HEAD_DIM), (40, HEAD_DIM), (5, 112), (3, 64)]
)
def test_head_counts_and_widths(device, num_heads, head_dim):
    """Head counts that leave the last 16-head block partial; NoPE widths 48 (padded to
    64 in the kernel) and 0 (RoPE only)."""
    args = make_case(5, num_heads, seed=7, head_dim=head_dim, device=device)
    q_fp8, weights_out = fused_indexer_q_rope_quant(*args)
    want_bytes, want_weights, _ = indexer_q_rope_quant_ref(*args, contract=device.type == "cuda")
    assert_same(q_fp8, weights_out, want_bytes, want_weights)


def test_scale_boundaries_and_floor(device):
    args = make_case(3, 16, seed=3, device=device)
    _, _, scale = indexer_q_rope_quant_ref(*args)
    assert torch.all(scale[:, 0] == 2.0**-22)  # all-zero head: amax floor 1e-4 -> 2**-22
    assert torch.all(scale[:, 1] == 8.0)  # amax exactly 448 * 8 keeps exponent 3
    q_fp8, weights_out = fused_indexer_q_rope_quant(*args)
    want_bytes, want_weights, _ = indexer_q_rope_quant_ref(*args, contract=device.type == "cuda")
    assert_same(q_fp8, weights_out, want_bytes, want_weights)
    assert torch.all(q_fp8.view(torch.uint8)[:, 1, 3] == 0x7E)  # 448 / 8 * 8 -> e4m3 max


def test_strided_inputs_and_untouched_bytes(device):
    """index_q and index_weights as views into wider buffers; outputs written through
    views: bytes and weights outside the views stay as poisoned."""
    positions, q, cache, weights, s1, s2 = make_case(6, 24, seed=11, device=device)
    q_wide = torch.zeros(6, 24, 256, dtype=torch.bfloat16, device=device)
    q_wide[..., 64:192] = q
    w_wide = torch.zeros(6, 29, dtype=torch.bfloat16, device=device)
    w_wide[:, 2:26] = weights
    q_view, w_view = q_wide[..., 64:192], w_wide[:, 2:26]
    out_wide = torch.full((6, 24, 200), 0xFF, dtype=torch.uint8, device=device)
    wout_wide = nan_empty(6, 31, dtype=torch.float32, device=device)
    launch_indexer_q_rope_quant(
        positions, q_view, cache, w_view, s1, s2, out_wide[..., 40:168], wout_wide[:, 3:27]
    )
    want_bytes, want_weights, _ = indexer_q_rope_quant_ref(
        positions, q, cache, weights, s1, s2, contract=device.type == "cuda"
    )
    assert_same(out_wide[..., 40:168], wout_wide[:, 3:27], want_bytes, want_weights)
    assert torch.all(out_wide[..., :40] == 0xFF) and torch.all(out_wide[..., 168:] == 0xFF)
    assert torch.isnan(wout_wide[:, :3]).all() and torch.isnan(wout_wide[:, 27:]).all()


def test_every_output_is_written(device):
    """Outputs poisoned with 0xFF (e4m3 NaN) and NaN: nothing of it may survive."""
    args = make_case(9, 64, seed=5, device=device)
    q_bytes = torch.full((9, 64, HEAD_DIM), 0xFF, dtype=torch.uint8, device=device)
    weights_out = nan_empty(9, 64, dtype=torch.float32, device=device)
    launch_indexer_q_rope_quant(*args, q_bytes, weights_out)
    assert not torch.any(q_bytes == 0xFF) and not torch.isnan(weights_out).any()
    want_bytes, want_weights, _ = indexer_q_rope_quant_ref(*args, contract=device.type == "cuda")
    assert_same(q_bytes, weights_out, want_bytes, want_weights)


def test_zero_tokens(device):
    positions, q, cache, weights, s1, s2 = make_case(1, 32, seed=0, device=device)
    q_fp8, weights_out = fused_indexer_q_rope_quant(
        positions[:0], q[:0], cache, weights[:0], s1, s2
    )
    assert q_fp8.shape == (0, 32, HEAD_DIM) and q_fp8.dtype == torch.float8_e4m3fn
    assert weights_out.shape == (0, 32) and weights_out.dtype == torch.float32


def test_output_layout_matches_vllms_allocation(device):
    """vLLM allocates ``empty_like(index_q, dtype=fp8)``: same shape and strides here,
    also for a permuted (dense, non-contiguous) index_q."""
    positions, q, cache, weights, s1, s2 = make_case(4, 16, seed=2, device=device)
    q_perm = q.transpose(0, 1).contiguous().transpose(0, 1)
    for index_q in (q, q_perm):
        q_fp8, weights_out = fused_indexer_q_rope_quant(positions, index_q, cache, weights, s1, s2)
        want = torch.empty_like(index_q, dtype=torch.float8_e4m3fn)
        assert q_fp8.shape == want.shape and q_fp8.stride() == want.stride()
        assert weights_out.stride() == torch.empty_like(weights, dtype=torch.float32).stride()
        want_bytes, want_weights, _ = indexer_q_rope_quant_ref(
            positions, index_q, cache, weights, s1, s2, contract=device.type == "cuda"
        )
        assert_same(q_fp8, weights_out, want_bytes, want_weights)


def test_errors_name_the_argument(device):
    positions, q, cache, weights, s1, s2 = make_case(2, 8, seed=1, device=device)
    base = dict(
        positions=positions,
        index_q=q,
        index_q_cos_sin_cache=cache,
        index_weights=weights,
        index_weights_softmax_scale=s1,
        index_weights_head_scale=s2,
    )
    cases = [
        (dict(use_fp4=True), "use_fp4: the MXFP4 indexer cache is not supported"),
        (dict(weights_out_dtype=torch.bfloat16), "weights_out_dtype"),
        (dict(index_q=q.float()), r"index_q: expected dtype torch\.bfloat16"),
        (dict(index_q_cos_sin_cache=cache.bfloat16()), "index_q_cos_sin_cache: expected dtype"),
        (dict(index_q_cos_sin_cache=cache[:, :48]), "power of two"),
        (dict(positions=positions[:1]), "must agree"),
        (dict(index_weights=weights[:, :4]), "must agree"),
        (dict(positions=positions.float()), "positions: expected dtype"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            fused_indexer_q_rope_quant(**{**base, **change})


# ------------------------------------------------------------------ the reference itself


def _fma_exact(a: float, b: float, c: float) -> np.float32:
    """Round the exact rational a*b + c to the nearest fp32, ties to even."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    r = np.float32(float(exact))
    cands = {r, np.nextafter(r, np.float32(np.inf)), np.nextafter(r, np.float32(-np.inf))}

    def key(v):
        return (abs(Fraction(float(v)) - exact), int(np.float32(v).view(np.int32)) & 1)

    return min(cands, key=key)


def test_fma_ref_rounds_once():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3000, generator=g) * torch.exp2(torch.randint(-20, 20, (3000,), generator=g))
    b = torch.randn(3000, generator=g)
    c = -(a * b) * (1 + torch.randn(3000, generator=g) * 1e-6)  # heavy cancellation
    c[::3] = torch.randn(1000, generator=g)
    # Double rounding trap: the fp64 sum lands exactly on the fp32 midpoint
    # 1 + 3 * 2**-24 although the exact sum is below it; the right answer is 1 + 2**-23.
    a[0], b[0], c[0] = 2**-12 * (1 + 2**-23), 2**-12 * (1 - 2**-23), 1 + 2**-23
    got = fma_f32_ref(a, b, c)
    exact = [_fma_exact(*map(float, v)) for v in zip(a, b, c, strict=True)]
    want = torch.tensor(exact, dtype=torch.float32)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert got[0].item() == 1 + 2**-23
    assert (a[0].double() * b[0].double() + c[0].double()).float().item() == 1 + 2**-22


@pytest.mark.vllm
def test_ref_rope_equals_vllm_forward_native():
    """The reference RoPE (contract=False) is vLLM's PyTorch RoPE: ``forward_native`` of
    DeepseekV4ScalingRotaryEmbedding computes ``x * cos + rotate_gptj(x) * sin``."""
    common = vllm_module("vllm.model_executor.layers.rotary_embedding.common")
    positions, q, cache, *_ = make_case(7, 16, seed=9)
    x = q[..., HEAD_DIM - ROPE_DIM :]
    rows = cache[positions]
    cos = rows[:, :32].repeat_interleave(2, dim=-1)[:, None]
    sin = rows[:, 32:].repeat_interleave(2, dim=-1)[:, None]
    theirs = (x * cos + common.rotate_gptj(x) * sin).to(torch.bfloat16)
    ours = rope_rows(q.float(), positions, cache)[..., HEAD_DIM - ROPE_DIM :].to(torch.bfloat16)
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))


# ------------------------------------------------------------------ against vLLM


@pytest.mark.vllm
def test_signature_equals_vllm():
    theirs = vllm_module(VLLM_FIQ).fused_indexer_q_rope_quant
    assert inspect.signature(fused_indexer_q_rope_quant) == inspect.signature(theirs)


@pytest.mark.vllm
@pytest.mark.parametrize("num_tokens,num_heads", [(3, 64), (5, 32)])
def test_equals_vllm_triton_kernel(num_tokens, num_heads):
    """vLLM's Triton kernel (its non-CuteDSL CUDA path), run by the interpreter with
    GPU-exact casts: same bytes, same folded weights."""
    fiq = vllm_module(VLLM_FIQ)
    args = make_case(num_tokens, num_heads, seed=42 + num_heads)
    positions, q, cache, weights, s1, s2 = args
    theirs_q = torch.empty_like(q, dtype=torch.float8_e4m3fn)
    theirs_w = nan_empty(num_tokens, num_heads, dtype=torch.float32)
    with gpu_casts_in_interpreter():
        fiq._FUSED_INDEXER_Q_ROPE_QUANT_TRITON_KERNEL(
            positions, q, cache, weights, s1, s2, theirs_q, theirs_w, fp8_max=448.0, use_fnuz=False
        )
    q_fp8, weights_out = fused_indexer_q_rope_quant(*args)
    assert_same(q_fp8, weights_out, theirs_q.view(torch.uint8), theirs_w)


# ------------------------------------------------------------------ Ampere fitness


def compile_ptx(jobs: dict[str, tuple[str, dict, dict, int, int]]) -> dict[str, dict]:
    """Compile ``label -> (kernel, signature, constexprs, cc, num_warps)`` in one
    subprocess without the interpreter; ``label -> {"ptx": str} | {"error": str}``."""
    code = (
        "import importlib, json, sys, triton\n"
        "from triton.backends.compiler import GPUTarget\n"
        "out = {}\n"
        "for label, (kernel, sig, cons, cc, warps) in json.loads(sys.stdin.read()).items():\n"
        "    mod, attr = kernel.split(':')\n"
        "    fn = importlib.import_module(mod)\n"
        "    for a in attr.split('.'): fn = getattr(fn, a)\n"
        "    sig = {n: 'constexpr' if n in cons else sig[n] for n in fn.arg_names}\n"
        "    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cons)\n"
        "    try:\n"
        "        opts = {'num_warps': warps}\n"
        "        k = triton.compile(src, target=GPUTarget('cuda', cc, 32), options=opts)\n"
        "        out[label] = {'ptx': k.asm['ptx']}\n"
        "    except Exception as e:\n"
        "        out[label] = {'error': f'{type(e).__name__}: {e} {e.__cause__!r}'}\n"
        "print(json.dumps(out))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


VLLM_KERNEL = f"{VLLM_FIQ}:FusedIndexerQRopeQuantTritonKernel.kernel"
VLLM_SIGNATURE = {
    "pos_ptr": "*i64",
    "index_q_ptr": "*bf16",
    "index_q_stride0": "i32",
    "index_q_stride1": "i32",
    "index_q_cos_sin_ptr": "*fp32",
    "index_q_cos_sin_stride": "i32",
    "index_q_fp8_ptr": "*fp8e4nv",
    "index_q_fp8_stride0": "i32",
    "index_q_fp8_stride1": "i32",
    "index_weights_ptr": "*bf16",
    "index_weights_stride": "i32",
    "index_weights_softmax_scale": "fp32",
    "index_weights_head_scale": "fp32",
    "index_weights_out_ptr": "*fp32",
    "index_weights_out_stride": "i32",
}
VLLM_CONSTEXPRS = {
    "INDEX_Q_HALF_ROT_DIM": 32,
    "INDEX_Q_HEAD_DIM": 128,
    "FP8_MAX": 448.0,
    "USE_FNUZ": False,
    "USE_EXPLICIT_FMA": False,
}


@pytest.fixture(scope="module")
def vllm_and_our_ptx():
    """vLLM's Triton kernel for sm_80 (refused) and sm_90, ours for sm_80: one compile run."""
    vllm_module(VLLM_FIQ)
    ours = ampere_kernel_specs()[0]
    return compile_ptx(
        {
            # vLLM launches its kernel with one warp.
            "vllm_sm80": (VLLM_KERNEL, VLLM_SIGNATURE, VLLM_CONSTEXPRS, 80, 1),
            "vllm_sm90": (VLLM_KERNEL, VLLM_SIGNATURE, VLLM_CONSTEXPRS, 90, 1),
            "ours_sm80": (ours.kernel, ours.signature, ours.constexprs, 80, ours.num_warps),
        }
    )


@pytest.mark.aot
@pytest.mark.vllm
def test_vllm_triton_kernel_is_refused_on_sm80(vllm_and_our_ptx):
    """Why the replacement exists: vLLM's Triton fallback converts to fp8e4nv."""
    error = vllm_and_our_ptx["vllm_sm80"].get("error")
    assert error is not None and "fp8e4nv not supported" in error, vllm_and_our_ptx["vllm_sm80"]


def rope_fmas(ptx: str) -> list[tuple[frozenset, tuple]]:
    """The ``fma.rn.f32`` of a scalar RoPE kernel's PTX as (multiplied values, addend),
    by symbolic evaluation: fp32 loads are named ``ld32_<k>`` and bf16 -> fp32 converts
    ``bf16_<k>`` in program order; the addend is ``("mul", {a, b})`` or
    ``("neg", ("mul", {a, b}))``."""
    val: dict[str, object] = {}
    counts = {"ld32": 0, "bf16": 0}
    fmas = []

    def name(kind: str) -> str:
        counts[kind] += 1
        return f"{kind}_{counts[kind] - 1}"

    for line in ptx.splitlines():
        if m := re.search(r"ld\.global\.b32 \{ (%r\d+) \}", line):
            val[m[1]] = name("ld32")
        elif m := re.search(r"cvt\.f32\.bf16\s+(%r\d+), %rs\d+", line):
            val[m[1]] = name("bf16")
        elif m := re.search(r"mul(?:\.rn)?\.f32\s+(%r\d+), (%r\d+), (%r\d+)", line):
            val[m[1]] = ("mul", frozenset((val.get(m[2]), val.get(m[3]))))
        elif m := re.search(r"neg\.f32\s+(%r\d+), (%r\d+)", line):
            val[m[1]] = ("neg", val.get(m[2]))
        elif m := re.search(r"fma\.rn\.f32\s+(%r\d+), (%r\d+), (%r\d+), (%r\d+)", line):
            fmas.append((frozenset((val.get(m[2]), val.get(m[3]))), val.get(m[4])))
    return fmas


@pytest.mark.aot
@pytest.mark.vllm
def test_gpu_rope_contraction_is_what_contract_true_models(vllm_and_our_ptx):
    """vLLM's kernel on an fp8 GPU (sm_90 PTX, one RoPE pair per thread): which product
    of each output is rounded first and which is fused, as ``rope/ref.py``'s
    ``contract=True`` models it (and ``triton_rope.rotate`` / ``rotate_cos_first`` write):
    even' = fma(e, cos, -(o * sin)), odd' = fma(e, sin, o * cos). Loads in program order:
    cos, sin (fp32), then e, o (bf16)."""
    cos, sin, e, o = "ld32_0", "ld32_1", "bf16_0", "bf16_1"
    theirs = rope_fmas(vllm_and_our_ptx["vllm_sm90"]["ptx"])
    assert theirs == [
        (frozenset((e, cos)), ("neg", ("mul", frozenset((o, sin))))),
        (frozenset((e, sin)), ("mul", frozenset((o, cos)))),
    ], f"vLLM's RoPE contraction changed: re-check ops/rope/ref.py ({theirs})"
    assert vllm_and_our_ptx["ours_sm80"]["ptx"].count("fma.rn.f32") >= 2


def test_contract_model_reproduces_the_bytes_vllm_differed_in_on_a_gpu(monkeypatch):
    """On an H200, vLLM's kernel differed from the sin-first model of the odd output in
    exactly two bytes of this case
    (benchmarks/results/NVIDIA_H200.gpu_tier_indexer_q_and_yoco_failures.log).
    The model ``contract=True`` uses must move exactly those bytes, and no weight."""
    from deepinfer_sm80.ops.rope import ref as rope_ref

    args = make_case(2048, 64, seed=1)
    model_bytes, model_w, _ = indexer_q_rope_quant_ref(*args, contract=True)

    def sin_first(e, o, cos, sin, contract=False, inverse=False):
        return fma_f32_ref(e, cos, -(o * sin)), fma_f32_ref(o, cos, e * sin)

    monkeypatch.setattr(rope_ref, "rotate_ref", sin_first)
    other_bytes, other_w, _ = indexer_q_rope_quant_ref(*args, contract=True)
    moved = (model_bytes.view(torch.uint8) != other_bytes.view(torch.uint8)).nonzero().tolist()
    assert moved == [[720, 47, 117], [1415, 35, 127]]
    assert torch.equal(model_w, other_w)


def test_rope_fmas_reads_both_contractions():
    """The PTX reader tells the two contractions of ``o * cos + e * sin`` apart."""
    head = (
        "ld.global.b32 { %r1 }, [ %rd1 + 0 ];\nld.global.b32 { %r2 }, [ %rd2 + 0 ];\n"
        "cvt.f32.bf16 %r3, %rs1;\ncvt.f32.bf16 %r4, %rs2;\n"
    )
    sin_first = head + "mul.f32 %r5, %r3, %r2;\nfma.rn.f32 %r6, %r4, %r1, %r5;\n"
    cos_first = head + "mul.f32 %r5, %r4, %r1;\nfma.rn.f32 %r6, %r3, %r2, %r5;\n"
    assert rope_fmas(sin_first) == [
        (frozenset(("bf16_1", "ld32_0")), ("mul", frozenset(("bf16_0", "ld32_1"))))
    ]
    assert rope_fmas(cos_first) == [
        (frozenset(("bf16_0", "ld32_1")), ("mul", frozenset(("bf16_1", "ld32_0"))))
    ]


# ------------------------------------------------------------------ GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,num_heads", [(1, 64), (4096, 64), (16384, 32)])
def test_production_shapes_bit_exact(device, num_tokens, num_heads):
    args = make_case(num_tokens, num_heads, seed=num_tokens, device=device)
    q_fp8, weights_out = fused_indexer_q_rope_quant(*args)
    want_bytes, want_weights, _ = indexer_q_rope_quant_ref(*args, contract=True)
    assert_same(q_fp8, weights_out, want_bytes, want_weights)


@pytest.mark.gpu
@pytest.mark.vllm
def test_gpu_equals_vllm_kernels(device):
    """On an fp8-capable GPU: bit-exact with vLLM's Triton kernel; vLLM's CuteDSL kernel
    (the one vLLM actually picks) within one e4m3 step on rare elements (its RoPE may
    round differently) and 2 ulps on the weights (it multiplies the two scales first)."""
    if torch.cuda.get_device_capability() < (8, 9):
        skip_not_applicable("vLLM's fp8 kernels need sm89+")
    fiq = vllm_module(VLLM_FIQ)
    args = make_case(2048, 64, seed=1, device=device)
    positions, q, cache, weights, s1, s2 = args
    q_fp8, weights_out = fused_indexer_q_rope_quant(*args)
    theirs_q = torch.empty_like(q, dtype=torch.float8_e4m3fn)
    theirs_w = torch.empty_like(weights, dtype=torch.float32)
    fiq._FUSED_INDEXER_Q_ROPE_QUANT_TRITON_KERNEL(
        positions, q, cache, weights, s1, s2, theirs_q, theirs_w, fp8_max=448.0, use_fnuz=False
    )
    assert_same(q_fp8, weights_out, theirs_q.view(torch.uint8), theirs_w)
    cute_q, cute_w = fiq.fused_indexer_q_rope_quant(*args)
    a, b = cute_q.float(), q_fp8.float()
    differ = cute_q.view(torch.uint8) != q_fp8.view(torch.uint8)
    print(f"CuteDSL: {int(differ.sum())} bytes differ of {differ.numel()}")
    # One e4m3 step (relative 2**-3, or the smallest subnormal 2**-9 near zero).
    assert torch.all((a - b).abs() <= torch.maximum(a.abs(), b.abs()) * 2**-3 + 2**-9)
    assert differ.float().mean() < 1e-3
    assert torch.allclose(cute_w, weights_out, rtol=2**-22, atol=0)
