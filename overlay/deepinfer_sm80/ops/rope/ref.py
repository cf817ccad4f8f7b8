"""PyTorch references for GPT-J RoPE as vLLM's kernels round it (``triton_rope.py``).

``rope_rows`` applies it (or its inverse) to the last ``rope_dim`` dims of each head in
two bit-exact ways: ``contract=False`` rounds every product and sum (PyTorch, and any
kernel under Triton's CPU interpreter); ``contract=True`` rounds
``fma(x, cos, +/-(partner * sin))`` once, what vLLM's Triton kernels compile to on a GPU.
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
