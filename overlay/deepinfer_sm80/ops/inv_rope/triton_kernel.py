"""Inverse RoPE (+ optional fp8 block quantization) before DeepSeek-V4.1's grouped wo_a.

Replaces vLLM 0.33.0's ``fused_inv_rope_fp8_quant``. Its Triton kernel converts to
``tl.float8e4nv`` after a ``if not QUANTIZE: return``; Triton still generates that code,
so even the bf16 path (``quantize=False``, the one sm80 takes) fails to compile below
sm_89 ("type fp8e4nv not supported in this architecture"). Here e4m3 is encoded in
software (``ops/fp8``).

One program handles ``BLOCK_H`` heads of one token, each a full ``HEAD_DIM`` row: the
RoPE partner of lane ``d`` is lane ``d ^ 1`` (a second, masked load of the same row,
served from L1), so per-block amax and the stores work on the row as it is laid out.
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops._validate import check_int, check_tensor
from deepinfer_sm80.ops.fp8.triton_fp8 import f32_to_e4m3
from deepinfer_sm80.ops.rope.triton_rope import load_f32, rotate, to_bf16

FP8_MAX = 448.0


@triton.jit(do_not_specialize=["num_tokens"])
def inv_rope_fp8_quant_kernel(
    o_ptr,
    o_stride_token,
    o_stride_head,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    out_ptr,
    out_stride_group,
    out_stride_token,
    scale_ptr,
    scale_stride_group,
    scale_stride_k,
    num_tokens,
    num_heads,
    HEADS_PER_GROUP: tl.constexpr,
    NOPE_DIM: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    QUANT_GROUP: tl.constexpr,
    QUANTIZE: tl.constexpr,
    PACKED_UE8M0: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    CHUNKS: tl.constexpr = HEAD_DIM // QUANT_GROUP
    HALF_ROPE: tl.constexpr = (HEAD_DIM - NOPE_DIM) // 2
    i_t = tl.program_id(0).to(tl.int64)
    o_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < num_heads
    i_g = (o_h // HEADS_PER_GROUP).to(tl.int64)
    i_j = o_h % HEADS_PER_GROUP  # head within its group

    # Scale entries per head: one per block, or one int32 per four UE8M0 bytes.
    SCALES: tl.constexpr = CHUNKS // 4 if PACKED_UE8M0 else CHUNKS
    if QUANTIZE:
        o_k = i_j[:, None] * SCALES + tl.arange(0, SCALES)[None, :]  # [BLOCK_H, SCALES]
        p_scale = scale_ptr + i_g[:, None] * scale_stride_group + i_t
        p_scale = p_scale + o_k.to(tl.int64) * scale_stride_k
        if i_t >= num_tokens:
            # Rows past the tokens pad the scale buffer to TMA alignment: zero them.
            b_zero = tl.zeros((BLOCK_H, SCALES), dtype=scale_ptr.dtype.element_ty)
            tl.store(p_scale, b_zero, mask=m_h[:, None])
            return

    o_d = tl.arange(0, HEAD_DIM)
    p_o = o_ptr + i_t * o_stride_token + o_h[:, None].to(tl.int64) * o_stride_head
    b_x = load_f32(p_o + o_d[None, :], m_h[:, None])  # [BLOCK_H, HEAD_DIM]

    is_rope = o_d >= NOPE_DIM
    o_pair = tl.maximum(o_d - NOPE_DIM, 0) >> 1
    b_partner = load_f32(p_o + (o_d ^ 1)[None, :], m_h[:, None] & is_rope[None, :])
    pos = tl.load(positions_ptr + i_t).to(tl.int64)
    p_cs = cos_sin_ptr + pos * cos_sin_stride
    b_cos = tl.load(p_cs + o_pair, mask=is_rope, other=1.0)  # [HEAD_DIM]
    b_sin = tl.load(p_cs + HALF_ROPE + o_pair, mask=is_rope, other=0.0)
    # Inverse rotation: even lanes take +partner*sin, odd lanes -partner*sin.
    b_sin = tl.where(((o_d - NOPE_DIM) & 1) == 0, b_sin, -b_sin)
    b_rot = rotate(b_x, b_partner, b_cos[None, :], b_sin[None, :])
    b_y = tl.where(is_rope[None, :], b_rot, b_x)

    p_out = out_ptr + i_g[:, None] * out_stride_group + i_t * out_stride_token
    p_out = p_out + (i_j[:, None] * HEAD_DIM + o_d[None, :]).to(tl.int64)  # [BLOCK_H, HEAD_DIM]
    if not QUANTIZE:
        tl.store(p_out, to_bf16(b_y), mask=m_h[:, None])
    else:
        b_blocks = tl.reshape(b_y, (BLOCK_H, CHUNKS, QUANT_GROUP))
        b_amax = tl.maximum(tl.max(tl.abs(b_blocks), axis=2), 1e-10)  # [BLOCK_H, CHUNKS]
        # vLLM's operations, so the scale is the same power of two on the GPU.
        b_scale = tl.exp2(tl.ceil(tl.log2(b_amax * (1.0 / 448.0))))
        b_q = tl.clamp(b_blocks / b_scale[:, :, None], -448.0, 448.0)
        b_q = tl.reshape(f32_to_e4m3(b_q), (BLOCK_H, HEAD_DIM))
        tl.store(p_out, b_q.to(tl.uint8), mask=m_h[:, None])
        if PACKED_UE8M0:
            b_e = (b_scale.to(tl.int32, bitcast=True) >> 23) & 0xFF
            b_lo, b_hi = tl.split(tl.reshape(b_e, (BLOCK_H, CHUNKS // 4, 2, 2)))
            b_e0, b_e2 = tl.split(b_lo)
            b_e1, b_e3 = tl.split(b_hi)
            b_packed = b_e0 | (b_e1 << 8) | (b_e2 << 16) | (b_e3 << 24)
            tl.store(p_scale, b_packed, mask=m_h[:, None])
        else:
            tl.store(p_scale, b_scale, mask=m_h[:, None])


def _allocate(
    o: torch.Tensor,
    n_groups: int,
    width: int,
    scale_inner: int,
    padded_tokens: int,
    quantize: bool,
    tma_aligned_scales: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's output buffers: values ``[G, T, width]``, scales ``[G, T, inner]`` over a
    token-minor (MN-major) storage padded to ``padded_tokens`` rows."""
    num_tokens = o.shape[0]
    out_buf = torch.empty(
        (n_groups, num_tokens, width),
        dtype=torch.float8_e4m3fn if quantize else o.dtype,
        device=o.device,
    )
    scale_dtype = torch.int32 if tma_aligned_scales else torch.float32
    if not quantize:
        return out_buf, torch.empty(0, dtype=scale_dtype, device=o.device)
    scale_buf = torch.empty(
        n_groups * scale_inner * padded_tokens, dtype=scale_dtype, device=o.device
    )
    scale_buf = scale_buf.as_strided(
        (n_groups, num_tokens, scale_inner), (scale_inner * padded_tokens, 1, padded_tokens)
    )
    return out_buf, scale_buf


def launch_inv_rope_fp8_quant(
    o: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    out_buf: torch.Tensor,
    scale_buf: torch.Tensor,
    n_groups: int,
    heads_per_group: int,
    nope_dim: int,
    quant_group_size: int,
    tma_aligned_scales: bool,
    quantize: bool,
    padded_tokens: int,
) -> None:
    """Run the kernel into caller-owned buffers laid out as ``_allocate`` makes them
    (``out_buf`` uint8 when quantizing); rows ``[T, padded_tokens)`` of the scale storage
    are zeroed."""
    num_tokens, num_heads, head_dim = o.shape
    if num_tokens == 0:
        return
    cfg = kernel_config("inv_rope.fused")
    block_h = cfg.constexpr_dict()["BLOCK_H"]
    rows = padded_tokens if quantize else num_tokens
    inv_rope_fp8_quant_kernel[(rows, triton.cdiv(num_heads, block_h))](
        o,
        o.stride(0),
        o.stride(1),
        positions,
        cos_sin_cache,
        cos_sin_cache.stride(0),
        out_buf,
        out_buf.stride(0),
        out_buf.stride(1),
        scale_buf,
        scale_buf.stride(0) if quantize else 0,
        scale_buf.stride(2) if quantize else 0,
        num_tokens,
        num_heads,
        HEADS_PER_GROUP=heads_per_group,
        NOPE_DIM=nope_dim,
        HEAD_DIM=head_dim,
        QUANT_GROUP=quant_group_size,
        QUANTIZE=quantize,
        PACKED_UE8M0=quantize and tma_aligned_scales,
        BLOCK_H=block_h,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        # The RoPE FMAs are explicit; nothing else may be contracted.
        enable_fp_fusion=False,
    )


def _check_args(
    o,
    positions,
    cos_sin_cache,
    n_groups,
    heads_per_group,
    nope_dim,
    rope_dim,
    quant_group_size,
    tma_aligned_scales,
    quantize,
) -> None:
    check_tensor("o", o, dtype=torch.bfloat16, ndim=3)
    dev = o.device
    check_tensor("positions", positions, dtype=(torch.int64, torch.int32), ndim=1, device=dev)
    check_tensor("cos_sin_cache", cos_sin_cache, dtype=torch.float32, ndim=2, device=dev)
    for name, value in (
        ("n_groups", n_groups),
        ("heads_per_group", heads_per_group),
        ("rope_dim", rope_dim),
        ("quant_group_size", quant_group_size),
    ):
        check_int(name, value, minimum=1)
    check_int("nope_dim", nope_dim, minimum=0)
    for name, value in (("tma_aligned_scales", tma_aligned_scales), ("quantize", quantize)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected a bool, got {value!r}")
    num_tokens, num_heads, head_dim = o.shape
    if num_heads != n_groups * heads_per_group:
        raise ValueError(
            f"o: has {num_heads} heads but n_groups x heads_per_group = "
            f"{n_groups} x {heads_per_group}; pass the local (per-rank) heads and groups"
        )
    if head_dim != nope_dim + rope_dim or rope_dim % 2:
        raise ValueError(
            f"o: head_dim {head_dim} must equal nope_dim {nope_dim} + rope_dim {rope_dim} "
            "(rope_dim even)"
        )
    if head_dim & (head_dim - 1) or quant_group_size & (quant_group_size - 1):
        raise ValueError(
            f"o / quant_group_size: head_dim {head_dim} and quant_group_size "
            f"{quant_group_size} must be powers of two"
        )
    if head_dim % quant_group_size:
        raise ValueError(f"quant_group_size: {quant_group_size} must divide head_dim {head_dim}")
    if quantize and tma_aligned_scales and (head_dim // quant_group_size) % 4:
        raise ValueError(
            "tma_aligned_scales: packs four UE8M0 scales per int32 within a head; "
            f"head_dim / quant_group_size = {head_dim // quant_group_size} is not a multiple of 4"
        )
    if positions.shape[0] != num_tokens:
        raise ValueError(
            f"positions: expected {num_tokens} entries (o's tokens), got {positions.shape[0]}"
        )
    if cos_sin_cache.shape[1] != rope_dim or cos_sin_cache.stride(1) != 1:
        raise ValueError(
            f"cos_sin_cache: expected [max_pos, {rope_dim}] (cos || sin) with unit last "
            f"stride, got shape {tuple(cos_sin_cache.shape)}"
        )
    if o.stride(2) != 1:
        raise ValueError("o: the head dimension must be contiguous (unit last stride)")


def _tma_aligned_tokens(num_tokens: int) -> int:
    # DeepGEMM's get_tma_aligned_size(num_tokens, 4): 16-byte rows of 4-byte scales.
    return -(-num_tokens // 4) * 4


def fused_inv_rope_fp8_quant(
    o: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    n_groups: int,
    heads_per_group: int,
    nope_dim: int = 448,
    rope_dim: int = 64,
    quant_group_size: int = 128,
    tma_aligned_scales: bool = False,
    quantize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse RoPE of the attention output, regrouped for the grouped wo_a (vLLM 0.33.0).

    Args:
        o: ``[T, H, head_dim]`` bf16 attention output (a view of the padded-heads buffer
            is fine: any token/head strides, unit last stride). H = n_groups x
            heads_per_group (local to the rank).
        positions: ``[T]`` int64 (int32 accepted).
        cos_sin_cache: ``[max_pos, rope_dim]`` fp32, cos || sin.
        n_groups, heads_per_group: wo_a's local groups and heads per group.
        nope_dim, rope_dim: per-head split (448 + 64 on V4.1); RoPE acts on the last
            rope_dim dims, GPT-J pairs.
        quant_group_size: fp8 block size along a head (128 on sm80/sm90 recipes).
        tma_aligned_scales: UE8M0 scales packed four per int32 (sm100) instead of fp32.
        quantize: fp8 output + scales; False (the sm80 path, bf16 wo_a) returns bf16.

    Returns:
        ``(output [T, G, heads_per_group * head_dim], scales)``: ``output`` is a
        ``[T, G, d]`` view of a group-major ``[G, T, d]`` buffer, bf16 (``o.dtype``) or
        ``float8_e4m3fn``; ``scales`` ``[T, G, d / quant_group_size]`` fp32 (or
        ``[T, G, d / quant_group_size / 4]`` int32) over a token-minor storage whose
        rows are padded to a multiple of 4 tokens (padding zeroed), or an empty tensor
        when not quantizing. Layouts, values and bytes equal vLLM's (see README).
    """
    _check_args(
        o,
        positions,
        cos_sin_cache,
        n_groups,
        heads_per_group,
        nope_dim,
        rope_dim,
        quant_group_size,
        tma_aligned_scales,
        quantize,
    )
    num_tokens, _, head_dim = o.shape
    width = heads_per_group * head_dim
    blocks = width // quant_group_size
    scale_inner = (blocks + 3) // 4 if tma_aligned_scales else blocks
    padded_tokens = _tma_aligned_tokens(num_tokens) if quantize else num_tokens
    out_buf, scale_buf = _allocate(
        o, n_groups, width, scale_inner, padded_tokens, quantize, tma_aligned_scales
    )
    launch_inv_rope_fp8_quant(
        o,
        positions,
        cos_sin_cache,
        out_buf.view(torch.uint8) if quantize else out_buf,
        scale_buf,
        n_groups,
        heads_per_group,
        nope_dim,
        quant_group_size,
        tma_aligned_scales,
        quantize,
        padded_tokens,
    )
    output = out_buf.transpose(0, 1)
    scales = scale_buf.transpose(0, 1) if quantize else scale_buf
    return output, scales


_MODULE = "deepinfer_sm80.ops.inv_rope.triton_kernel"


def ampere_kernel_specs() -> list[KernelSpec]:
    """The configs this module ships, for the sm80/sm86 fitness tier.

    V4.1 heads: 448 NoPE + 64 RoPE; heads per group 8 at every TP size. The sm80 path
    (bf16 wo_a) runs QUANTIZE=False; the fp8 variants (128-blocks with fp32 scales as on
    sm90, 32-blocks packed as on sm100) are compiled too, so the optional path fits.
    """
    cfg = kernel_config("inv_rope.fused")
    variants = (
        ("bf16", False, False, 128, "*bf16", "*fp32"),
        ("fp8-fp32-scales", True, False, 128, "*u8", "*fp32"),
        ("fp8-ue8m0-packed", True, True, 32, "*u8", "*i32"),
    )
    return [
        KernelSpec.from_jit(
            f"inv_rope.fused[{label}]",
            f"{_MODULE}:inv_rope_fp8_quant_kernel",
            pointers={
                "o_ptr": "*bf16",
                "positions_ptr": "*i64",
                "cos_sin_ptr": "*fp32",
                "out_ptr": out_type,
                "scale_ptr": scale_type,
            },
            constexprs={
                "HEADS_PER_GROUP": 8,
                "NOPE_DIM": 448,
                "HEAD_DIM": 512,
                "QUANT_GROUP": group,
                "QUANTIZE": quantize,
                "PACKED_UE8M0": packed,
                "BLOCK_H": cfg.constexpr_dict()["BLOCK_H"],
            },
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            ints_divisible_by_16=(
                "o_stride_token",
                "o_stride_head",
                "cos_sin_stride",
                "out_stride_group",
                "out_stride_token",
                "num_heads",
            ),
        )
        for label, quantize, packed, group, out_type, scale_type in variants
    ]


__all__ = [
    "ampere_kernel_specs",
    "fused_inv_rope_fp8_quant",
    "launch_inv_rope_fp8_quant",
]
