"""PyTorch references for GPT-J RoPE as vLLM's kernels round it (``triton_rope.py``).

``rope_rows`` applies it (or its inverse) to the last ``rope_dim`` dims of each head in
two bit-exact ways: ``contract=False`` rounds every product and sum (PyTorch, and any
kernel under Triton's CPU interpreter); ``contract=True`` rounds one product first and
fuses the other into an FMA, as vLLM's Triton kernels compile on a GPU. Which product is
rounded first is the compiler's choice, read in their sm_90 PTX (Triton 3.8):
- the forward kernel (``fused_indexer_q``): ``e' = fma(e, cos, -(o * sin))`` but
  ``o' = fma(e, sin, o * cos)``: in ``o * cos + e * sin`` the second product is fused;
- the inverse kernel (``fused_inv_rope_fp8_quant``): both lanes ``fma(x, cos,
  +/-(partner * sin))``.
"""

import torch


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
    inverse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-J RoPE of fp32 pairs: ``(e*cos - o*sin, o*cos + e*sin)``; ``inverse`` with
    ``-sin`` passed in undoes it.

    ``contract=False``: every product and sum rounded (PyTorch, Triton's interpreter).
    ``contract=True``: vLLM's kernels on a GPU (see the module docstring): the even
    output ``fma(e, cos, -(o*sin))``; the odd one ``fma(e, sin, o*cos)`` forward and
    ``fma(o, cos, e*sin)`` inverse.
    """
    if not contract:
        return x_even * cos - x_odd * sin, x_odd * cos + x_even * sin
    even = fma_f32_ref(x_even, cos, -(x_odd * sin))
    odd = (
        fma_f32_ref(x_odd, cos, x_even * sin) if inverse else fma_f32_ref(x_even, sin, x_odd * cos)
    )
    return even, odd


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
    r_even, r_odd = rotate_ref(x_even, x_odd, cos, sin, contract, inverse)
    rotated = torch.stack([r_even, r_odd], dim=-1).flatten(-2)
    return torch.cat([x[..., :nope], rotated], dim=-1)
