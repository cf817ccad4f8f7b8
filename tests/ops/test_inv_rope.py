"""ops/inv_rope: the output projection's inverse RoPE (+ optional fp8), bit-exact against
ref.py and vLLM's kernel, and vLLM's own SM80 o_proj path run with it on CPU.

vLLM's kernel is run by the interpreter with GPU-exact casts (see test_indexer_q): the
bf16 path stores fp32 into bf16, which the interpreter alone would truncate.
"""

import importlib
import inspect
import types

import pytest
import torch

from deepinfer_sm80.ops.inv_rope import fused_inv_rope_fp8_quant
from deepinfer_sm80.ops.inv_rope.ref import inv_rope_fp8_quant_ref
from deepinfer_sm80.ops.inv_rope.triton_kernel import (
    launch_inv_rope_fp8_quant,
)
from deepinfer_sm80.ops.rope.ref import rope_rows
from tools.poison import nan_empty
from tools.tiers import skip_not_applicable

from .test_indexer_q import _CACHE, compile_ptx, gpu_casts_in_interpreter, vllm_module

# DeepSeek-V4.1 attention: 64 heads x 512 (448 NoPE + 64 RoPE), o_groups 8 (8 heads per
# group at every TP size), o_lora_rank 1024; FlashMLA pads the heads buffer to 64.
HEADS, HEAD_DIM, NOPE, ROPE = 64, 512, 448, 64
GROUPS, O_LORA = 8, 1024
VLLM_INV = "vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant"
VLLM_V41_O_PROJ = "vllm.models.deepseek_v41.nvidia.ops.o_proj"
VLLM_V4_O_PROJ = "vllm.models.deepseek_v4.nvidia.ops.o_proj"


def make_o(num_tokens: int, num_heads: int, seed: int, device="cpu", padded_heads: int = 0):
    """Attention output rows (bf16) with outliers and per-head scale, and positions.

    ``padded_heads``: return a ``[:, :num_heads]`` view of a ``[T, padded_heads, 512]``
    buffer whose extra heads are NaN (FlashMLA's padding, never read)."""
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(num_tokens, num_heads, HEAD_DIM, generator=g)
    o *= torch.logspace(-3, 2, num_heads)[None, :, None]
    o = torch.where(torch.rand(o.shape, generator=g) < 0.005, o * 40, o)
    if num_heads > 1:
        o[:, 1] = 0.0
    o = o.to(torch.bfloat16).to(device)
    if padded_heads:
        buf = torch.full(
            (num_tokens, padded_heads, HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=device
        )
        buf[:, :num_heads] = o
        o = buf[:, :num_heads]
    positions = torch.randint(0, _CACHE.shape[0], (num_tokens,), generator=g)
    if num_tokens > 1:
        positions[:2] = torch.tensor([0, 65535])
    return o, positions.to(device), _CACHE.to(device)


def bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    return t.view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


def assert_bits_equal(name, got, want):
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    diff = (bits(got) != bits(want)).nonzero()
    assert diff.numel() == 0, f"{name}: {diff.shape[0]} elements differ, first {diff[0].tolist()}"


def scale_storage(scales: torch.Tensor, num_groups: int, padded_tokens: int) -> torch.Tensor:
    """Every entry of the token-minor scale buffer, padding rows included: [G, S, Tpad]."""
    inner = scales.shape[-1]
    return torch.as_strided(
        scales, (num_groups, inner, padded_tokens), (inner * padded_tokens, padded_tokens, 1), 0
    )


def check_against_ref(o, positions, cache, groups, qgs=128, tma=False, quantize=True):
    num_tokens, num_heads, _ = o.shape
    out, scales = fused_inv_rope_fp8_quant(
        o, positions, cache, groups, num_heads // groups, NOPE, ROPE, qgs, tma, quantize
    )
    want_out, want_scales = inv_rope_fp8_quant_ref(
        o, positions, cache, groups, num_heads // groups, qgs, tma, quantize,
        contract=o.device.type == "cuda",
    )  # fmt: skip
    assert_bits_equal("output", out, want_out)
    if not quantize:
        assert out.dtype == torch.bfloat16 and scales.numel() == 0
        return out, scales
    assert out.dtype == torch.float8_e4m3fn
    assert_bits_equal("scales", scales, want_scales)
    padded = -(-num_tokens // 4) * 4
    assert torch.all(scale_storage(scales, groups, padded)[..., num_tokens:] == 0)
    return out, scales


# ------------------------------------------------------------------ against ref.py


@pytest.mark.parametrize("num_heads,groups", [(HEADS, GROUPS), (16, 2)])
@pytest.mark.parametrize("num_tokens", [1, 3, 37])
def test_bf16_path_equals_ref(device, num_tokens, num_heads, groups):
    """quantize=False: what V4.1 runs on sm80 (bf16 wo_a)."""
    o, positions, cache = make_o(num_tokens, num_heads, seed=num_tokens + num_heads, device=device)
    out, _ = check_against_ref(o, positions, cache, groups, quantize=False)
    # Output layout: a [T, G, d] view of a group-major buffer, as bmm's input wants.
    assert out.stride() == (num_heads // groups * HEAD_DIM, num_tokens * out.shape[2], 1)
    assert torch.equal(out[:, :, :NOPE], o.reshape(out.shape)[:, :, :NOPE])  # NoPE passes


@pytest.mark.parametrize("qgs,tma", [(128, False), (128, True), (32, True), (64, False)])
@pytest.mark.parametrize("num_tokens", [1, 6])
def test_fp8_path_equals_ref(device, num_tokens, qgs, tma):
    """quantize=True (fp8 wo_a: sm90 fp32 scales, sm100 packed UE8M0); odd token counts
    leave padding rows in the TMA-aligned scale buffer, which must be zero."""
    o, positions, cache = make_o(num_tokens, 16, seed=qgs + num_tokens, device=device)
    check_against_ref(o, positions, cache, 2, qgs=qgs, tma=tma)


@pytest.mark.parametrize("tp,quantize", [(2, False), (2, True), (8, False)])
def test_view_of_padded_heads_buffer(device, tp, quantize):
    """TP > 1: ``o`` is ``attn_out[:, :n_local_heads]`` of the 64-head FlashMLA buffer,
    whose padded heads hold garbage (NaN here) that must not leak in."""
    local_heads = HEADS // tp
    o, positions, cache = make_o(5, local_heads, seed=tp, device=device, padded_heads=HEADS)
    assert not o.is_contiguous()
    out, _ = check_against_ref(o, positions, cache, GROUPS // tp, quantize=quantize)
    assert not torch.isnan(out.float()).any()


def test_every_output_is_written_and_nothing_else(device):
    """Caller buffers: values inside a wider poisoned buffer, the scale storage poisoned
    with NaN; every value and scale is written, padding rows become 0, nothing outside."""
    num_tokens, groups, hpg = 3, 2, 8
    o, positions, cache = make_o(num_tokens, groups * hpg, seed=4, device=device)
    width, inner, padded = hpg * HEAD_DIM, hpg * HEAD_DIM // 128, 4
    wide = torch.full((groups, num_tokens, width + 64), 0xFF, dtype=torch.uint8, device=device)
    out_buf = wide[:, :, 32 : 32 + width]
    storage = nan_empty(groups * inner * padded, dtype=torch.float32, device=device)
    scale_buf = storage.as_strided((groups, num_tokens, inner), (inner * padded, 1, padded))
    launch_inv_rope_fp8_quant(
        o, positions, cache, out_buf, scale_buf, groups, hpg, NOPE, 128, False, True, padded
    )
    want_out, want_scales = inv_rope_fp8_quant_ref(
        o, positions, cache, groups, hpg, contract=device.type == "cuda"
    )
    assert_bits_equal("output", out_buf.transpose(0, 1), want_out)
    assert_bits_equal("scales", scale_buf.transpose(0, 1), want_scales)
    assert torch.all(wide[..., :32] == 0xFF) and torch.all(wide[..., 32 + width :] == 0xFF)
    assert not torch.isnan(storage).any()
    assert torch.all(storage.view(groups, inner, padded)[..., num_tokens:] == 0)


def test_zero_tokens(device):
    o, positions, cache = make_o(1, 16, seed=0, device=device)
    for quantize in (False, True):
        out, scales = fused_inv_rope_fp8_quant(o[:0], positions[:0], cache, 2, 8, quantize=quantize)
        assert out.shape == (0, 2, 8 * HEAD_DIM)
        assert scales.shape == ((0, 2, 32) if quantize else (0,))


def test_errors_name_the_argument(device):
    o, positions, cache = make_o(2, 16, seed=1, device=device)
    base = dict(o=o, positions=positions, cos_sin_cache=cache, n_groups=2, heads_per_group=8)
    cases = [
        (dict(n_groups=3), "o: has 16 heads but n_groups x heads_per_group"),
        (dict(o=o.float()), r"o: expected dtype torch\.bfloat16"),
        (dict(cos_sin_cache=cache.double()), "cos_sin_cache: expected dtype"),
        (dict(cos_sin_cache=cache[:, :32]), "cos_sin_cache: expected"),
        (dict(positions=positions[:1]), "positions: expected 2 entries"),
        (dict(nope_dim=440), "must equal nope_dim"),
        (dict(quant_group_size=96), "powers of two"),
        (dict(quant_group_size=256, tma_aligned_scales=True), "multiple of 4"),
        (dict(quantize=1), "quantize: expected a bool"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            fused_inv_rope_fp8_quant(**{**base, **change})


# ------------------------------------------------------------------ against vLLM


@pytest.mark.vllm
def test_signature_equals_vllm():
    theirs = vllm_module(VLLM_INV).fused_inv_rope_fp8_quant
    assert inspect.signature(fused_inv_rope_fp8_quant) == inspect.signature(theirs)


@pytest.mark.vllm
@pytest.mark.parametrize(
    "num_tokens,num_heads,groups,qgs,tma,quantize",
    [
        (3, HEADS, GROUPS, 128, False, False),  # the sm80 path at V4.1's 64 heads
        (0, 16, 2, 128, False, False),
        (3, 16, 2, 128, False, True),  # sm90 recipe: fp32 scales
        (5, 16, 2, 32, True, True),  # sm100 recipe: packed UE8M0
        (0, 16, 2, 128, False, True),
    ],
)
def test_equals_vllm(num_tokens, num_heads, groups, qgs, tma, quantize):
    """vLLM's own ``fused_inv_rope_fp8_quant`` (its custom op and Triton kernel) under
    the interpreter with GPU-exact casts: same values, scales, padding and layouts."""
    inv = vllm_module(VLLM_INV)
    o, positions, cache = make_o(max(num_tokens, 1), num_heads, seed=17)
    o, positions = o[:num_tokens], positions[:num_tokens]
    args = (o, positions, cache, groups, num_heads // groups, NOPE, ROPE, qgs, tma, quantize)
    with gpu_casts_in_interpreter():
        theirs = inv.fused_inv_rope_fp8_quant(*args)
    ours = fused_inv_rope_fp8_quant(*args)
    for name, a, b in zip(("output", "scales"), ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.stride() == b.stride(), (name, a.stride(), b.stride())
        assert_bits_equal(name, a, b)
    if quantize and num_tokens:
        padded = -(-num_tokens // 4) * 4
        assert_bits_equal(
            "scale storage",
            scale_storage(ours[1], groups, padded),
            scale_storage(theirs[1], groups, padded),
        )


@pytest.mark.vllm
def test_ref_equals_vllm_forward_native_inverse():
    """contract=False is vLLM's PyTorch RoPE with ``inverse=True`` (sin negated)."""
    common = vllm_module("vllm.model_executor.layers.rotary_embedding.common")
    o, positions, cache = make_o(4, 8, seed=3)
    x = o[..., NOPE:]
    rows = cache[positions]
    cos = rows[:, :32].repeat_interleave(2, dim=-1)[:, None]
    sin = -rows[:, 32:].repeat_interleave(2, dim=-1)[:, None]
    theirs = (x * cos + common.rotate_gptj(x) * sin).to(torch.bfloat16)
    ours = rope_rows(o.float(), positions, cache, inverse=True)[..., NOPE:].to(torch.bfloat16)
    assert_bits_equal("rope", ours, theirs)


def _v41_layer(num_local_heads: int, num_local_groups: int, cache, seed: int):
    """The attributes ``dsv41_o_proj`` reads from the attention layer on sm80: wo_a
    dequantized to bf16 at load ([G * o_lora, hpg * 512], EmulationMxfp8LinearKernel),
    wo_b stubbed as the identity (it is Marlin MXFP8 on sm80, unchanged by us)."""
    g = torch.Generator().manual_seed(seed)
    wo_a = torch.nn.Module()
    weight = torch.randn(num_local_groups * O_LORA, 8 * HEAD_DIM, generator=g) * 0.02
    wo_a.weight = torch.nn.Parameter(weight.to(torch.bfloat16), requires_grad=False)
    return types.SimpleNamespace(
        n_local_heads=num_local_heads,
        n_local_groups=num_local_groups,
        nope_head_dim=NOPE,
        rope_head_dim=ROPE,
        o_lora_rank=O_LORA,
        _einsum_recipe=(1, 128, 128),  # compute_fp8_einsum_recipe on cc 8.x
        _tma_aligned_scales=False,
        rotary_emb=types.SimpleNamespace(cos_sin_cache=cache),
        wo_a=wo_a,
        wo_b=types.SimpleNamespace(quant_method=None),
        _wo_b_proj=lambda z: z,
    )


@pytest.mark.vllm
@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_sm80_o_proj_path_with_our_kernel(monkeypatch, tp):
    """vLLM's V4.1 o_proj entry (``dsv41_o_proj``) with ``fused_inv_rope_fp8_quant``
    rebound where it is used (``deepseek_v4.nvidia.ops.o_proj``), as the plugin does:
    same z as vLLM's own kernel, and as ref.py + torch.bmm."""
    v41 = vllm_module(VLLM_V41_O_PROJ)
    v4 = importlib.import_module(VLLM_V4_O_PROJ)
    heads, groups = HEADS // tp, GROUPS // tp
    o, positions, cache = make_o(3, heads, seed=tp, padded_heads=HEADS)
    attn_out = o.as_strided((3, HEADS, HEAD_DIM), o.stride())  # the padded buffer
    layer = _v41_layer(heads, groups, cache, seed=tp)
    with gpu_casts_in_interpreter():
        theirs = v41.dsv41_o_proj(layer, attn_out, positions)
    monkeypatch.setattr(v4, "fused_inv_rope_fp8_quant", fused_inv_rope_fp8_quant)
    ours = v41.dsv41_o_proj(layer, attn_out, positions)
    assert ours.shape == (3, groups * O_LORA) and ours.dtype == torch.bfloat16
    assert_bits_equal("z", ours, theirs)
    # The same GEMM call as vLLM's bf16 branch, on ref.py's rotated rows.
    rotated, _ = inv_rope_fp8_quant_ref(o, positions, cache, groups, 8, quantize=False)
    w = layer.wo_a.weight.view(groups, O_LORA, -1)
    want = torch.empty(3, groups, O_LORA, dtype=torch.bfloat16)
    torch.bmm(rotated.transpose(0, 1), w.transpose(1, 2), out=want.transpose(0, 1))
    assert_bits_equal("z vs ref", ours, want.flatten(1))


# ------------------------------------------------------------------ Ampere fitness


VLLM_KERNEL = f"{VLLM_INV}:FusedInvRopeFP8QuantKernel.kernel"
VLLM_CONSTEXPRS = {
    "heads_per_group": 8,
    "fp8_max": 448.0,
    "eps": 1e-10,
    "QUANT_GROUP_SIZE": 128,
    "CHUNKS_PER_HEAD": 4,
    "NOPE_DIM": 448,
    "HALF_ROPE": 32,
    "QUANTIZE": False,
    "TMA_ALIGNED_SCALES": False,
    "launch_pdl": False,
}
VLLM_SIGNATURE = {
    "o_ptr": "*bf16",
    "positions_ptr": "*i64",
    "cos_sin_cache_ptr": "*fp32",
    "out_ptr": "*bf16",
    "scale_ptr": "*fp32",
    "num_tokens": "i32",
    "o_stride_token": "i32",
    "o_stride_head": "i32",
    "cache_stride_pos": "i32",
    "out_stride_group": "i32",
    "out_stride_token": "i32",
    "scale_stride_group": "i32",
    "scale_stride_k": "i32",
}


@pytest.fixture(scope="module")
def vllm_inv_ptx():
    vllm_module(VLLM_INV)
    return compile_ptx(
        {
            # vLLM launches its kernel with one warp.
            "sm80": (VLLM_KERNEL, VLLM_SIGNATURE, VLLM_CONSTEXPRS, 80, 1),
            "sm90": (VLLM_KERNEL, VLLM_SIGNATURE, VLLM_CONSTEXPRS, 90, 1),
        }
    )


@pytest.mark.aot
@pytest.mark.vllm
def test_vllm_bf16_path_is_refused_on_sm80(vllm_inv_ptx):
    """The sm80 blocker: with QUANTIZE=False vLLM's kernel still reaches its fp8e4nv
    conversion (dead code after ``if not QUANTIZE: return`` is generated anyway)."""
    error = vllm_inv_ptx["sm80"].get("error")
    assert error is not None and "fp8e4nv not supported" in error, vllm_inv_ptx["sm80"]


@pytest.mark.aot
@pytest.mark.vllm
def test_gpu_rope_contraction_is_what_contract_true_models(vllm_inv_ptx):
    """On an fp8 GPU (sm_90 PTX) vLLM's inverse RoPE is contracted: every RoPE output is
    one ``fma.rn.f32`` (its thread's two RoPE lanes), with no separate fp32 add or sub
    left in the bf16 path. ``ref.py``'s ``contract=True`` models exactly that."""
    ptx = vllm_inv_ptx["sm90"]["ptx"]
    assert ptx.count("fma.rn.f32") == 2, "vLLM's RoPE contraction changed: re-check ref.py"
    assert "add.f32" not in ptx and "sub.f32" not in ptx


# ------------------------------------------------------------------ GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 4096, 16384])
@pytest.mark.parametrize("tp", [1, 2])
def test_production_shapes_bit_exact(device, num_tokens, tp):
    o, positions, cache = make_o(
        num_tokens, HEADS // tp, seed=num_tokens, device=device, padded_heads=HEADS
    )
    check_against_ref(o, positions, cache, GROUPS // tp, quantize=False)
    check_against_ref(o, positions, cache, GROUPS // tp)


@pytest.mark.gpu
@pytest.mark.vllm
def test_gpu_equals_vllm(device):
    if torch.cuda.get_device_capability() < (8, 9):
        skip_not_applicable("vLLM's kernel needs sm89+")
    inv = vllm_module(VLLM_INV)
    o, positions, cache = make_o(2048, HEADS, seed=5, device=device)
    for quantize, tma, qgs in ((False, False, 128), (True, False, 128), (True, True, 32)):
        args = (o, positions, cache, GROUPS, 8, NOPE, ROPE, qgs, tma, quantize)
        ours, theirs = fused_inv_rope_fp8_quant(*args), inv.fused_inv_rope_fp8_quant(*args)
        for a, b in zip(ours, theirs, strict=True):
            assert_bits_equal(f"quantize={quantize} tma={tma}", a, b)
