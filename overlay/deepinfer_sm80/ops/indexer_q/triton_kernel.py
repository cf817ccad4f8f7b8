"""Index-Q RoPE + fp8 quantization for sm80/sm86 (vLLM's ``fused_indexer_q_rope_quant``).

On CUDA, vLLM 0.33.0 runs this step through a CuteDSL kernel whenever ``cutlass``
imports (always: it is a hard dependency), which packs e4m3 with
``cvt.rn.satfinite.e4m3x2.f32`` (ptxas: sm_90+; sm_89 with PTX 8.1); its Triton
fallback converts to ``tl.float8e4nv``, which Triton refuses below sm_89. Here the bytes
are encoded in software (``ops/fp8``).

One program handles ``BLOCK_H`` heads of one token: the token's cos/sin row is read
once, the RoPE dims are loaded as ``[BLOCK_H, ROPE_DIM]`` and split into even/odd lanes
with a reshape (contiguous loads, no stride-2 gathers).
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops._validate import check_tensor
from deepinfer_sm80.ops.fp8.triton_fp8 import f32_to_e4m3
from deepinfer_sm80.ops.rope.triton_rope import load_f32, rotate, rotate_cos_first, round_to_bf16


@triton.jit
def indexer_q_rope_quant_kernel(
    positions_ptr,
    q_ptr,
    q_stride0,
    q_stride1,
    cos_sin_ptr,
    cos_sin_stride,
    q_fp8_ptr,
    q_fp8_stride0,
    q_fp8_stride1,
    weights_ptr,
    weights_stride,
    weights_out_ptr,
    weights_out_stride,
    softmax_scale,
    head_scale,
    num_heads,
    NOPE_DIM: tl.constexpr,
    NOPE_BLOCK: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    HALF: tl.constexpr = ROPE_DIM // 2
    i_t = tl.program_id(0).to(tl.int64)
    o_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < num_heads

    pos = tl.load(positions_ptr + i_t).to(tl.int64)
    o_half = tl.arange(0, HALF)
    p_cs = cos_sin_ptr + pos * cos_sin_stride
    b_cos = tl.load(p_cs + o_half)[None, :]  # [1, HALF]
    b_sin = tl.load(p_cs + HALF + o_half)[None, :]

    p_q = q_ptr + i_t * q_stride0 + o_h[:, None].to(tl.int64) * q_stride1  # [BLOCK_H, 1]
    o_r = tl.arange(0, ROPE_DIM)
    b_rope = load_f32(p_q + NOPE_DIM + o_r[None, :], m_h[:, None])  # [BLOCK_H, ROPE_DIM]
    b_even, b_odd = tl.split(tl.reshape(b_rope, (BLOCK_H, HALF, 2)))
    # vLLM materializes the rotated values as bf16 before taking the amax.
    b_even_rot = round_to_bf16(rotate(b_even, b_odd, b_cos, -b_sin))
    b_odd_rot = round_to_bf16(rotate_cos_first(b_odd, b_even, b_cos, b_sin))
    b_rope = tl.reshape(tl.join(b_even_rot, b_odd_rot), (BLOCK_H, ROPE_DIM))

    o_n = tl.arange(0, NOPE_BLOCK)
    m_n = m_h[:, None] & (o_n < NOPE_DIM)[None, :]
    b_nope = load_f32(p_q + o_n[None, :], m_n)  # [BLOCK_H, NOPE_BLOCK]

    b_amax = tl.maximum(tl.max(tl.abs(b_rope), axis=1), tl.max(tl.abs(b_nope), axis=1))
    # vLLM's formula, same operations: a power of two, 2**ceil(log2(max(amax, 1e-4)/448)).
    b_scale = tl.exp2(tl.ceil(tl.log2(tl.div_rn(tl.maximum(b_amax, 1e-4), 448.0))))

    p_out = q_fp8_ptr + i_t * q_fp8_stride0 + o_h[:, None].to(tl.int64) * q_fp8_stride1
    b_q_nope = f32_to_e4m3(tl.div_rn(b_nope, b_scale[:, None]))
    tl.store(p_out + o_n[None, :], b_q_nope.to(tl.uint8), mask=m_n)
    b_q_rope = f32_to_e4m3(tl.div_rn(b_rope, b_scale[:, None]))
    tl.store(p_out + NOPE_DIM + o_r[None, :], b_q_rope.to(tl.uint8), mask=m_h[:, None])

    # Q is stored without its scale: the scale is folded into the head weights, in
    # vLLM's order (weights * q_scale * softmax_scale * head_scale, fp32).
    b_w = load_f32(weights_ptr + i_t * weights_stride + o_h, m_h)
    b_w = b_w * b_scale
    b_w = b_w * softmax_scale
    b_w = b_w * head_scale
    tl.store(weights_out_ptr + i_t * weights_out_stride + o_h, b_w, mask=m_h)


def _check_inputs(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    index_weights: torch.Tensor,
) -> None:
    check_tensor("positions", positions, dtype=(torch.int64, torch.int32), ndim=1)
    dev = positions.device
    check_tensor("index_q", index_q, dtype=torch.bfloat16, ndim=3, device=dev)
    check_tensor("index_q_cos_sin_cache", cos_sin_cache, dtype=torch.float32, ndim=2, device=dev)
    check_tensor(
        "index_weights", index_weights, dtype=(torch.bfloat16, torch.float32), ndim=2, device=dev
    )
    num_tokens, num_heads, head_dim = index_q.shape
    rope_dim = cos_sin_cache.shape[1]
    if positions.shape[0] != num_tokens or index_weights.shape != (num_tokens, num_heads):
        raise ValueError(
            f"positions {tuple(positions.shape)}, index_q {tuple(index_q.shape)} and "
            f"index_weights {tuple(index_weights.shape)} must agree on [T] and [T, H]"
        )
    if rope_dim < 2 or rope_dim & (rope_dim - 1) or rope_dim > head_dim:
        raise ValueError(
            f"index_q_cos_sin_cache: its width is rope_dim (cos || sin) and must be a power "
            f"of two <= head_dim {head_dim}, got {rope_dim}"
        )
    if index_q.stride(2) != 1 or cos_sin_cache.stride(1) != 1 or index_weights.stride(1) != 1:
        raise ValueError(
            "index_q, index_q_cos_sin_cache and index_weights need a unit stride in their "
            "last dimension"
        )


def launch_indexer_q_rope_quant(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    index_q_cos_sin_cache: torch.Tensor,
    index_weights: torch.Tensor,
    index_weights_softmax_scale: float,
    index_weights_head_scale: float,
    q_fp8_bytes: torch.Tensor,
    weights_out: torch.Tensor,
) -> None:
    """Write the e4m3fn bytes of RoPE'd ``index_q`` into ``q_fp8_bytes`` ``[T, H, D]``
    uint8 and the folded weights into ``weights_out`` ``[T, H]`` fp32 (both any strides
    with a unit last stride). Inputs as for ``fused_indexer_q_rope_quant``."""
    _check_inputs(positions, index_q, index_q_cos_sin_cache, index_weights)
    dev = index_q.device
    check_tensor("q_fp8_bytes", q_fp8_bytes, dtype=torch.uint8, ndim=3, device=dev)
    check_tensor("weights_out", weights_out, dtype=torch.float32, ndim=2, device=dev)
    if q_fp8_bytes.shape != index_q.shape or weights_out.shape != index_weights.shape:
        raise ValueError(
            "q_fp8_bytes and weights_out must have index_q's and index_weights' shapes"
        )
    if q_fp8_bytes.stride(2) != 1 or weights_out.stride(1) != 1:
        raise ValueError("q_fp8_bytes and weights_out need a unit stride in their last dimension")
    _launch(
        positions,
        index_q,
        index_q_cos_sin_cache,
        index_weights,
        index_weights_softmax_scale,
        index_weights_head_scale,
        q_fp8_bytes,
        weights_out,
    )


def _launch(
    positions,
    index_q,
    index_q_cos_sin_cache,
    index_weights,
    index_weights_softmax_scale,
    index_weights_head_scale,
    q_fp8_bytes,
    weights_out,
) -> None:
    """The launch, arguments already checked."""
    num_tokens, num_heads, head_dim = index_q.shape
    if num_tokens == 0 or num_heads == 0:
        return
    rope_dim = index_q_cos_sin_cache.shape[1]
    nope_dim = head_dim - rope_dim
    cfg = kernel_config("indexer_q.rope_quant")
    block_h = cfg.constexpr_dict()["BLOCK_H"]
    indexer_q_rope_quant_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        positions,
        index_q,
        index_q.stride(0),
        index_q.stride(1),
        index_q_cos_sin_cache,
        index_q_cos_sin_cache.stride(0),
        q_fp8_bytes,
        q_fp8_bytes.stride(0),
        q_fp8_bytes.stride(1),
        index_weights,
        index_weights.stride(0),
        weights_out,
        weights_out.stride(0),
        float(index_weights_softmax_scale),
        float(index_weights_head_scale),
        num_heads,
        NOPE_DIM=nope_dim,
        NOPE_BLOCK=max(triton.next_power_of_2(nope_dim), 1),
        ROPE_DIM=rope_dim,
        BLOCK_H=block_h,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        # The RoPE FMAs are explicit; nothing else may be contracted.
        enable_fp_fusion=False,
    )


def fused_indexer_q_rope_quant(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    index_q_cos_sin_cache: torch.Tensor,
    # Index weights
    index_weights: torch.Tensor,
    index_weights_softmax_scale: float,
    index_weights_head_scale: float,
    use_fp4: bool = False,
    weights_out_dtype: torch.dtype = torch.float32,
) -> tuple[
    torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    torch.Tensor,
]:
    """RoPE + fp8 quantization of the sparse indexer's queries (vLLM 0.33.0 semantics).

    Args:
        positions: ``[T]`` int64 (int32 accepted) token positions.
        index_q: ``[T, H, D]`` bf16 (V4.1: H = ``index_n_heads``, D = 128), unit last stride.
        index_q_cos_sin_cache: ``[max_pos, rope_dim]`` fp32, cos || sin (rope_dim = 64).
        index_weights: ``[T, H]`` bf16 or fp32 per-head weights.
        index_weights_softmax_scale, index_weights_head_scale: folded into the weights.
        use_fp4: must be False: the MXFP4 index cache is not supported on Ampere.
        weights_out_dtype: must be fp32 (as vLLM requires on the fp8 path).

    Returns:
        ``(q_fp8, weights_out)``: ``q_fp8`` ``torch.float8_e4m3fn`` shaped and strided like
        ``index_q`` (RoPE on the last rope_dim dims, then x / scale, scale =
        2**ceil(log2(max(amax_head, 1e-4) / 448))); ``weights_out`` ``[T, H]`` fp32 =
        weights * scale * softmax_scale * head_scale. Bytes equal vLLM's kernel (see README).
    """
    if use_fp4:
        raise ValueError(
            "use_fp4: the MXFP4 indexer cache is not supported on Ampere (its packing is "
            "sm100-only in vLLM); leave attention_config.indexer_kv_dtype at 'auto'/'fp8'"
        )
    if weights_out_dtype != torch.float32:
        raise ValueError(
            f"weights_out_dtype: the fp8 path folds the Q scale into fp32 weights; pass "
            f"torch.float32 (got {weights_out_dtype}; bf16 is for vLLM's sm100 sparse logits)"
        )
    _check_inputs(positions, index_q, index_q_cos_sin_cache, index_weights)
    q_fp8 = torch.empty_like(index_q, dtype=torch.float8_e4m3fn)
    weights_out = torch.empty_like(index_weights, dtype=torch.float32)
    _launch(
        positions,
        index_q,
        index_q_cos_sin_cache,
        index_weights,
        index_weights_softmax_scale,
        index_weights_head_scale,
        q_fp8.view(torch.uint8),
        weights_out,
    )
    return q_fp8, weights_out


_MODULE = "deepinfer_sm80.ops.indexer_q.triton_kernel"


def ampere_kernel_specs() -> list[KernelSpec]:
    """The configs this module ships, for the sm80/sm86 fitness tier.

    V4.1: index_head_dim 128 with qk_rope_head_dim 64 (nope 64); bf16 queries, fp32
    cos/sin, bf16 weights from ``weights_proj``.
    """
    cfg = kernel_config("indexer_q.rope_quant")
    return [
        KernelSpec.from_jit(
            f"indexer_q.rope_quant[w={w_type}]",
            f"{_MODULE}:indexer_q_rope_quant_kernel",
            pointers={
                "positions_ptr": "*i64",
                "q_ptr": "*bf16",
                "cos_sin_ptr": "*fp32",
                "q_fp8_ptr": "*u8",
                "weights_ptr": w_type,
                "weights_out_ptr": "*fp32",
            },
            scalars={"softmax_scale": "fp32", "head_scale": "fp32"},
            constexprs={
                "NOPE_DIM": 64,
                "NOPE_BLOCK": 64,
                "ROPE_DIM": 64,
                "BLOCK_H": cfg.constexpr_dict()["BLOCK_H"],
            },
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            ints_divisible_by_16=(
                "q_stride0",
                "q_stride1",
                "cos_sin_stride",
                "q_fp8_stride0",
                "q_fp8_stride1",
                "weights_stride",
                "weights_out_stride",
                "num_heads",
            ),
        )
        for w_type in ("*bf16", "*fp32")
    ]


__all__ = [
    "ampere_kernel_specs",
    "fused_indexer_q_rope_quant",
    "launch_indexer_q_rope_quant",
]
