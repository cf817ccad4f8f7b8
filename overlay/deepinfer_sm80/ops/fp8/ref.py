"""PyTorch references for e4m3 and UE8M0: torch's own conversions are the truth."""

import torch

E4M3_MAX = 448.0


def e4m3_decode_ref(byte: torch.Tensor) -> torch.Tensor:
    """uint8 e4m3fn bytes -> fp32 via ``torch.float8_e4m3fn``."""
    return byte.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def e4m3_encode_ref(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> uint8 e4m3fn bytes: clamp to +-448, then torch's RNE conversion."""
    x = x.to(torch.float32)
    clamped = torch.where(torch.isnan(x), x, x.clamp(-E4M3_MAX, E4M3_MAX))
    return clamped.to(torch.float8_e4m3fn).view(torch.uint8)


def ue8m0_decode_ref(byte: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> fp32 ``2**(s-127)`` for s in 1..254; 0 -> +0.0, 255 -> +inf.

    The two end bytes follow the bit-shift decode the kernels use (see
    ``triton_fp8``); 2**(s-127) is exact in fp32 for s in 1..254.
    """
    s = byte.to(torch.int32)
    val = torch.exp2((s - 127).to(torch.float64)).to(torch.float32)
    val = torch.where(s == 0, torch.zeros_like(val), val)
    return torch.where(s == 255, torch.full_like(val, float("inf")), val)
