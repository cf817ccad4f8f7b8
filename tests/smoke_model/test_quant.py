"""MXFP8 / MXFP4 encodings: exact power-of-two scales and errors within the format's bound."""

import torch

from deepinfer_sm80.smoke_model import quant


def _weights(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) / shape[1] ** 0.5
    w[3, :32] = 0.0  # an all-zero block
    w[5, 40] = 7.5  # an outlier that sets its block's scale
    return w


def test_fp8_roundtrip_within_half_a_grid_step():
    w = _weights((96, 160))
    q, s = quant.quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert s.dtype == torch.float8_e8m0fnu and s.shape == (3, 5)
    back = quant.dequantize_fp8(q, s)
    scale = quant.e8m0_to_float(s).repeat_interleave(32, 0).repeat_interleave(32, 1)
    # e4m3: 3 mantissa bits (relative half-step 2^-4); subnormal spacing 2^-9 of the scale
    bound = torch.maximum(w.abs() * 2.0**-4, scale * 2.0**-10)
    assert torch.all((back - w).abs() <= bound * 1.0001)
    assert torch.equal(back[3, :32], torch.zeros(32))
    # the block maximum lands at or below 448 after scaling: no saturation
    assert back[5, 40].item() == 7.5


def test_fp8_row_blocks_have_one_scale_per_row_and_32_columns():
    w = _weights((7, 64))
    q, s = quant.quantize_fp8(w, block_rows=1)
    assert s.shape == (7, 2)
    assert torch.allclose(quant.dequantize_fp8(q, s, 1), w, rtol=2.0**-4, atol=1e-6)


def test_fp4_roundtrip_within_the_e2m1_grid_bound():
    w = _weights((16, 128))
    packed, s = quant.quantize_fp4(w)
    assert packed.dtype == torch.int8 and packed.shape == (16, 64)
    assert s.dtype == torch.float8_e8m0fnu and s.shape == (16, 4)
    back = quant.dequantize_fp4(packed, s)
    scale = quant.e8m0_to_float(s).repeat_interleave(32, 1)
    bound = scale * torch.clamp((w / scale).abs() / 4, min=0.25)
    assert torch.all((back - w).abs() <= bound * 1.0001)
    assert back[5, 40].item() == 7.5 or abs(back[5, 40].item() - 7.5) <= 1.0


def test_fp4_packs_the_even_element_in_the_low_nibble():
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1], w[0, 2] = 6.0, -1.0, 0.5  # scale 1: codes 7, 8|2, 1
    packed, s = quant.quantize_fp4(w)
    assert s.view(torch.uint8).tolist() == [[127]]
    raw = packed.view(torch.uint8)[0].tolist()
    assert raw[0] == 0x7 | (0xA << 4)
    assert raw[1] == 0x1


def test_scales_are_ue8m0_exponents_of_the_block_maximum():
    w = torch.full((32, 32), 0.001)
    w[0, 0] = 448.0 * 2.0**-3
    _, s = quant.quantize_fp8(w)
    assert s.view(torch.uint8).item() == 127 - 3
