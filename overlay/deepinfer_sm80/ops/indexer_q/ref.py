"""PyTorch references for the index-Q RoPE + fp8 quantizer (and the RoPE it shares).

``indexer_q_rope_quant_ref`` follows vLLM 0.33.0's ``fused_indexer_q_rope_quant`` (fp8
path) step by step, in the same fp32 operations:

1. GPT-J RoPE on the last ``rope_dim`` dims of each head (pairs ``(2i, 2i+1)``,
   ``cos``/``sin`` = the two halves of the cache row at the token's position), rounded
   to bf16; the leading dims pass through.
2. ``scale = 2**ceil(log2(max(amax, 1e-4) / 448))`` per (token, head), amax over the
   whole head after step 1.
3. Bytes = e4m3fn of ``x / scale`` (round to nearest even; ``|x / scale| <= 448`` by
   construction, so nothing saturates).
4. ``weights_out = ((weights * scale) * softmax_scale) * head_scale`` in fp32, the
   Python scales rounded to fp32 first, as a Triton launch does.

Step 1 is computed two ways: ``contract=False`` rounds the products and the sum
separately (PyTorch's ``forward_native``, and any kernel under Triton's CPU
interpreter); ``contract=True`` rounds ``fma(x, cos, +/-(partner * sin))`` once, which is
what vLLM's kernel compiles to on a GPU (see ``rope.py``). Both are bit-exact models.
"""

import torch

from deepinfer_sm80.ops.fp8.ref import e4m3_encode_ref

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4


def fma_f32_ref(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` for fp32 tensors with a single round-to-nearest-even, like ``fma.rn.f32``.

    The product of two fp32 values is exact in fp64 (48 significant bits); the fp64 sum
    is rounded once more, and its rounding error ``err`` is recovered exactly (TwoSum).
    Rounding that sum to fp32 can only go wrong when it landed exactly on the midpoint
    between two fp32 values while the exact sum did not: then ``err``'s sign says which
    side the exact sum is on. Finite, non-overflowing inputs only.
    """
    a64, b64, c64 = a.double(), b.double(), c.double()
    p = a64 * b64
    s = p + c64
    b_virtual = s - p
    err = (p - (s - b_virtual)) + (c64 - b_virtual)
    r = s.float()
    toward = torch.where(s > r.double(), float("inf"), float("-inf")).float()
    n = torch.nextafter(r, toward)
    midpoint = (r.double() + n.double()) * 0.5
    n_is_right = (s == midpoint) & (err != 0) & ((err > 0) == (n.double() > r.double()))
    return torch.where(n_is_right, n, r)


def rotate_ref(
    x_even: torch.Tensor,
    x_odd: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    contract: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-J RoPE of fp32 pairs: ``(e*cos - o*sin, o*cos + e*sin)``; pass ``-sin`` to invert.

    ``contract=False``: every product and sum rounded (PyTorch, Triton's interpreter).
    ``contract=True``: ``fma(e, cos, -(o*sin))`` and ``fma(o, cos, e*sin)``, the product
    with ``sin`` rounded first (vLLM's Triton kernels on a GPU).
    """
    if contract:
        return fma_f32_ref(x_even, cos, -(x_odd * sin)), fma_f32_ref(x_odd, cos, x_even * sin)
    return x_even * cos - x_odd * sin, x_odd * cos + x_even * sin


def rope_rows(
    x: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    inverse: bool = False,
    contract: bool = False,
) -> torch.Tensor:
    """fp32 ``x [T, H, D]`` with GPT-J RoPE applied to its last ``rope_dim`` dims.

    The rotated dims come back unrounded (fp32); the leading dims are ``x`` as it is.
    """
    rope_dim = cos_sin_cache.shape[-1]
    half = rope_dim // 2
    nope = x.shape[-1] - rope_dim
    rows = cos_sin_cache[positions.long()].float()
    cos = rows[:, None, :half]
    sin = rows[:, None, half:]
    if inverse:
        sin = -sin
    x_even, x_odd = x[..., nope::2], x[..., nope + 1 :: 2]
    r_even, r_odd = rotate_ref(x_even, x_odd, cos, sin, contract)
    rotated = torch.stack([r_even, r_odd], dim=-1).flatten(-2)
    return torch.cat([x[..., :nope], rotated], dim=-1)


def indexer_q_rope_quant_ref(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    index_q_cos_sin_cache: torch.Tensor,
    index_weights: torch.Tensor,
    index_weights_softmax_scale: float,
    index_weights_head_scale: float,
    contract: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3fn bytes ``[T, H, D]`` uint8, ``weights_out [T, H]`` fp32, ``scale [T, H]``)."""
    nope = index_q.shape[-1] - index_q_cos_sin_cache.shape[-1]
    x = rope_rows(index_q.float(), positions, index_q_cos_sin_cache, contract=contract)
    # The rotated dims are materialized as bf16 before the amax (vLLM does the same).
    x = torch.cat([x[..., :nope], x[..., nope:].to(torch.bfloat16).float()], dim=-1)
    amax = x.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    q_bytes = e4m3_encode_ref(x / scale[..., None])
    f32 = lambda v: torch.tensor(v, dtype=torch.float32, device=index_weights.device)  # noqa: E731
    weights = index_weights.float() * scale
    weights = weights * f32(index_weights_softmax_scale)
    weights = weights * f32(index_weights_head_scale)
    return q_bytes, weights, scale
