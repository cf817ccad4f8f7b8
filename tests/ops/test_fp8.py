"""ops/fp8: software e4m3 and UE8M0 are bit-exact against torch, exhaustively."""

import math

import pytest
import torch
import triton
import triton.language as tl

from deepinfer_sm80.ops.fp8 import (
    e4m3_decode_ref,
    e4m3_encode_ref,
    e4m3_to_f32,
    e4m3_ue8m0_to_bf16,
    f32_to_e4m3,
    ue8m0_decode_ref,
    ue8m0_to_f32,
)

BLOCK = 4096


@triton.jit
def _decode_kernel(byte_ptr, e4m3_ptr, ue8m0_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    b = tl.load(byte_ptr + o, mask=m)
    tl.store(e4m3_ptr + o, e4m3_to_f32(b), mask=m)
    tl.store(ue8m0_ptr + o, ue8m0_to_f32(b), mask=m)


@triton.jit
def _encode_kernel(x_ptr, byte_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m)
    tl.store(byte_ptr + o, f32_to_e4m3(x).to(tl.uint8), mask=m)


@triton.jit
def _scaled_bf16_kernel(byte_ptr, scale_ptr, out_ptr, n_rows, GROUP: tl.constexpr):
    # [rows, 256] tiles; a row's columns come in GROUP-wide runs sharing one scale byte,
    # as in a V4 record (GROUP=64). The packed PTX needs runs of 4.
    i = tl.program_id(0)
    o_c = tl.arange(0, 256)
    b = tl.load(byte_ptr + i * 256 + o_c)
    s = tl.load(scale_ptr + i * (256 // GROUP) + o_c // GROUP)
    tl.store(out_ptr + i * 256 + o_c, e4m3_ue8m0_to_bf16(b, s))


def _decode(byte: torch.Tensor):
    e4m3 = torch.full(byte.shape, 12345.0, device=byte.device)
    ue8m0 = torch.full(byte.shape, 12345.0, device=byte.device)
    _decode_kernel[(triton.cdiv(byte.numel(), BLOCK),)](
        byte, e4m3, ue8m0, byte.numel(), BLOCK=BLOCK
    )
    return e4m3, ue8m0


def _encode(x: torch.Tensor) -> torch.Tensor:
    out = torch.full(x.shape, 0xAA, dtype=torch.uint8, device=x.device)
    _encode_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    return out


def _assert_bytes_equal(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> None:
    bad = (got != want).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise AssertionError(
            f"{bad.numel()} of {x.numel()} encodings differ; first x={x[i].item()!r} "
            f"(bits {x[i : i + 1].view(torch.int32).item():#010x}): got {int(got[i]):#04x}, "
            f"torch {int(want[i]):#04x}"
        )


def test_e4m3_decode_all_256_bytes(device):
    byte = torch.arange(256, dtype=torch.uint8, device=device)
    got, _ = _decode(byte)
    want = e4m3_decode_ref(byte)
    nan = torch.isnan(want)
    assert nan.sum() == 2  # 0x7F and 0xFF
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


@pytest.mark.parametrize("group", [64, 4])
def test_scaled_bf16_decode_every_byte_and_scale(device, group):
    """Every (byte, scale) pair: the packed PTX (GPU) / fp32 path (interpreter) equals
    torch's fp32 product cast to bf16, bit for bit (NaN codes stay NaN, subnormal e4m3
    values and products that round to bf16 subnormals included). group=4 changes the
    scale within every packed 4-byte word's neighbour, catching a lane mix-up."""
    scales = torch.arange(256, dtype=torch.uint8, device=device)
    byte = torch.arange(256, dtype=torch.uint8, device=device).repeat(256, 1)
    byte = torch.roll(byte, shifts=1, dims=1)  # every lane of a word sees every byte
    scale = scales[:, None].repeat(1, 256 // group).contiguous()
    out = torch.full((256, 256), float("nan"), dtype=torch.bfloat16, device=device)
    _scaled_bf16_kernel[(256,)](byte, scale, out, 256, GROUP=group)
    want = (
        e4m3_decode_ref(byte.flatten()).view(256, 256)
        * ue8m0_decode_ref(scale.flatten()).view(256, -1).repeat_interleave(group, 1)
    ).to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    got_bits, want_bits = out.view(torch.int16), want.view(torch.int16)
    checked = ~nan
    if device.type == "cpu":
        # The interpreter's fp32 -> bf16 cast mis-rounds bf16 subnormals (numpy has no
        # bf16); those 5% of pairs are checked on a GPU, where the PTX path runs.
        checked &= want.float().abs() >= 2.0**-126
    bad = ((got_bits != want_bits) & checked).nonzero()
    assert bad.numel() == 0, (
        f"{bad.shape[0]} values differ; first (scale row, column) {tuple(bad[0].tolist())}: "
        f"byte {int(byte[tuple(bad[0])]):#04x} got {float(out[tuple(bad[0])])!r} "
        f"want {float(want[tuple(bad[0])])!r}"
    )


def test_ue8m0_decode_all_256_bytes(device):
    byte = torch.arange(256, dtype=torch.uint8, device=device)
    _, got = _decode(byte)
    assert torch.equal(got.view(torch.int32), ue8m0_decode_ref(byte).view(torch.int32))
    for s in range(1, 255):
        assert got[s].item() == math.ldexp(1.0, s - 127)
    # Documented end bytes: 0 -> +0.0 (not the denormal 2**-127), 255 -> +inf.
    assert got[0].item() == 0.0 and not math.copysign(1.0, got[0].item()) < 0
    assert got[255].item() == math.inf


def _e4m3_grid() -> torch.Tensor:
    """Every finite e4m3 value, midpoints between neighbours and one fp32 ulp around
    each: the points where rounding and ties decide the result."""
    vals = e4m3_decode_ref(torch.arange(0, 0x7F, dtype=torch.uint8)).double()  # 0 .. 448
    mids = (vals[1:] + vals[:-1]) / 2
    pts = torch.cat([vals, mids, torch.tensor([464.0, 480.0, 1e4, 3.0e38])]).float()
    bits = pts.view(torch.int32)
    around = torch.cat([bits - 1, bits, bits + 1]).clamp_min(0).view(torch.float32)
    return torch.cat([around, -around])


def _exponent_sweep() -> torch.Tensor:
    """All 2**11 high mantissas x critical low bits, for fp32 exponents 2**-27 .. 2**13
    (every e4m3 subnormal, normal, tie and saturation case) -- about 1M values."""
    exps = torch.arange(100, 141, dtype=torch.int32)
    hi = torch.arange(2048, dtype=torch.int32) << 12
    lo = torch.tensor([0, 1, 0x7FF, 0x800, 0x801, 0xFFF], dtype=torch.int32)
    bits = (exps[:, None, None] << 23) | hi[None, :, None] | lo[None, None, :]
    mags = bits.flatten().view(torch.float32)
    return torch.cat([mags, -mags])


def _random_finite(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    return x[torch.isfinite(x)]


@pytest.mark.parametrize(
    "name,points",
    [
        pytest.param("grid", _e4m3_grid, id="e4m3-values-midpoints-ulps"),
        pytest.param("sweep", _exponent_sweep, id="exponent-sweep-1M"),
        pytest.param("random", lambda: _random_finite(1 << 20, 0), id="random-bits-1M"),
        pytest.param(
            "small",
            lambda: torch.randn(1 << 18, generator=torch.Generator().manual_seed(1)) * 1e-2,
            id="subnormal-heavy",
        ),
        pytest.param(
            "zeros",
            lambda: torch.tensor([0.0, -0.0, 448.0, -448.0, 1e-45, -1e-45]),
            id="signed-zero-max",
        ),
    ],
)
def test_e4m3_encode_matches_torch_of_clamped(device, name, points):
    x = points().to(device)
    got = _encode(x)
    want = e4m3_encode_ref(x)
    _assert_bytes_equal(got.cpu(), want.cpu(), x.cpu())


def test_e4m3_encode_nan_and_saturation(device):
    x = torch.tensor([float("nan"), -float("nan"), 1e30, -1e30, 449.0, -463.99], device=device)
    got = _encode(x).tolist()
    assert got[0] & 0x7F == 0x7F and got[1] & 0x7F == 0x7F
    assert got[2:] == [0x7E, 0xFE, 0x7E, 0xFE]
