"""PyTorch reference for the output projection's inverse RoPE (+ optional fp8 quantization).

It follows vLLM 0.33.0's ``fused_inv_rope_fp8_quant`` step by step:

1. Inverse GPT-J RoPE (``sin`` negated) on the last ``rope_dim`` dims of every head, in
   fp32 (``rope_rows(..., inverse=True)``: ``contract=False`` is PyTorch's
   ``forward_native(inverse=True)`` and the CPU interpreter, ``contract=True`` the FMA
   vLLM's kernel compiles to on a GPU).
2. Heads regrouped as ``[T, n_groups, heads_per_group * head_dim]`` (a group's heads are
   consecutive).
3. ``quantize=False``: the rotated values rounded to ``o``'s dtype (bf16).
   ``quantize=True``: per ``quant_group_size`` block of the *fp32* values,
   ``scale = 2**ceil(log2(max(amax, 1e-10) * fp32(1/448)))``, bytes = e4m3fn of
   ``clamp(x / scale, -448, 448)``; scales as fp32, or, for ``tma_aligned_scales``, their
   UE8M0 exponent bytes packed four per int32 (little end first).
"""

import torch

from deepinfer_sm80.ops.fp8.ref import e4m3_encode_ref
from deepinfer_sm80.ops.rope.ref import rope_rows

FP8_MAX = 448.0
AMAX_FLOOR = 1e-10


def inv_rope_fp8_quant_ref(
    o: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    n_groups: int,
    heads_per_group: int,
    quant_group_size: int = 128,
    tma_aligned_scales: bool = False,
    quantize: bool = True,
    contract: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dense results: ``(out [T, G, hpg * D], scales [T, G, blocks] | None)``.

    ``out`` is ``o.dtype`` without quantization, else the e4m3fn bytes (uint8);
    ``scales`` is fp32 ``[T, G, hpg * D / quant_group_size]``, or int32
    ``[T, G, that / 4]`` with ``tma_aligned_scales``.
    """
    num_tokens, num_heads, head_dim = o.shape
    x = rope_rows(o.float(), positions, cos_sin_cache, inverse=True, contract=contract)
    width = heads_per_group * head_dim
    if not quantize:
        return x.to(o.dtype).reshape(num_tokens, n_groups, width), None
    blocks = x.reshape(num_tokens, num_heads, head_dim // quant_group_size, quant_group_size)
    amax = blocks.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    inv_max = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32, device=o.device)
    scale = torch.exp2(torch.ceil(torch.log2(amax * inv_max)))
    q = e4m3_encode_ref((blocks / scale[..., None]).clamp(-FP8_MAX, FP8_MAX))
    out = q.reshape(num_tokens, n_groups, width)
    scale = scale.reshape(num_tokens, n_groups, width // quant_group_size)
    if tma_aligned_scales:
        exponent = (scale.view(torch.int32) >> 23) & 0xFF
        lanes = exponent.reshape(num_tokens, n_groups, -1, 4).to(torch.int64)
        packed = (lanes << torch.tensor([0, 8, 16, 24], device=o.device)).sum(dim=-1)
        # Keep the low 32 bits as a signed int32 (byte 3 may set the sign bit).
        packed = torch.where(packed >= 2**31, packed - 2**32, packed)
        return out, packed.to(torch.int32)
    return out, scale
