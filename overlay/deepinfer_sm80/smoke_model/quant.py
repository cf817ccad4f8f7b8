"""The two block formats of the checkpoint, with their exact inverses.

MXFP8 (dense linears, Engram tables): e4m3 values, one power-of-two UE8M0 scale
per block. Linears use 32 x 32 blocks (``weight_block_size [32, 32]``; vLLM
repeats each scale row over the 32 output rows it covers); Engram tables use
1 x 32 blocks (one scale per 32 values of a row).

MXFP4 (routed experts): e2m1 values packed two per byte, the even element in
the low nibble, one UE8M0 scale per 32 values of a row.

A scale is ``2 ** ceil(log2(amax / max_code))``, so the largest magnitude of a
block lands at or below the format's largest code and nothing saturates.
"""

from __future__ import annotations

import torch

BLOCK = 32
E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E8M0_BIAS = 127
# amax floor: an all-zero block still gets a finite scale.
_TINY = 2.0**-100


def _exponent(amax: torch.Tensor, max_code: float) -> torch.Tensor:
    exp = torch.ceil(torch.log2(amax.clamp_min(_TINY) / max_code))
    return exp.clamp(-E8M0_BIAS, 254 - E8M0_BIAS)


def _e8m0(exp: torch.Tensor) -> torch.Tensor:
    return (exp + E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    return torch.exp2(scale.view(torch.uint8).float() - E8M0_BIAS)


def _blocks(w: torch.Tensor, rows: int) -> torch.Tensor:
    """[O, I] -> [O/rows, rows, I/32, 32] (O padded with zeros to a multiple of rows)."""
    out, inp = w.shape
    if inp % BLOCK:
        raise ValueError(f"input size {inp} is not a multiple of {BLOCK}")
    pad = (-out) % rows
    if pad:
        w = torch.cat([w, w.new_zeros(pad, inp)])
    return w.view(-1, rows, inp // BLOCK, BLOCK)


def quantize_fp8(w: torch.Tensor, block_rows: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [O, I] -> (e4m3 [O, I], e8m0 [ceil(O/block_rows), I/32])."""
    out = w.shape[0]
    blocks = _blocks(w.float(), block_rows)
    exp = _exponent(blocks.abs().amax(dim=(1, 3)), E4M3_MAX)  # [Ob, Ib]
    scaled = blocks / torch.exp2(exp)[:, None, :, None]
    q = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    q = q.reshape(-1, w.shape[1])[:out]
    return q.contiguous(), _e8m0(exp).contiguous()


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block_rows: int = BLOCK) -> torch.Tensor:
    s = e8m0_to_float(scale).repeat_interleave(block_rows, 0)[: q.shape[0]]
    return q.float() * s.repeat_interleave(BLOCK, 1)


def quantize_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [O, I] -> (packed int8 [O, I/2], e8m0 [O, I/32])."""
    out, inp = w.shape
    blocks = _blocks(w.float(), 1).view(out, inp // BLOCK, BLOCK)
    exp = _exponent(blocks.abs().amax(dim=2), E2M1_MAX)
    scaled = (blocks / torch.exp2(exp)[:, :, None]).view(out, inp)
    grid = torch.tensor(E2M1_GRID, device=w.device)
    midpoints = (grid[1:] + grid[:-1]) / 2
    magnitude = torch.bucketize(scaled.abs().clamp(max=E2M1_MAX), midpoints)
    sign = ((scaled < 0) & (magnitude > 0)).to(torch.uint8) << 3
    code = magnitude.to(torch.uint8) | sign
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return packed.view(torch.int8).contiguous(), _e8m0(exp).contiguous()


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    raw = packed.view(torch.uint8)
    codes = torch.stack([raw & 0x0F, raw >> 4], dim=-1).reshape(raw.shape[0], -1)
    grid = torch.tensor(E2M1_GRID, device=raw.device)
    values = grid[(codes & 0x07).long()] * torch.where((codes & 0x08) > 0, -1.0, 1.0)
    return values * e8m0_to_float(scale).repeat_interleave(BLOCK, 1)
