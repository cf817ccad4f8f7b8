"""Software OCP e4m3 (``float8_e4m3fn``) and UE8M0 for Triton on sm80/sm86.

Ampere has no fp8 instructions, and Triton refuses the ``tl.float8e4nv`` type below
sm_89 even as a bitcast target. These device functions work on the raw bytes with
integer and fp32 arithmetic only, so every kernel that includes them compiles for
sm_80/sm_86 and runs under ``TRITON_INTERPRET=1``.

Bit-exact contract (tested exhaustively in ``tests/ops/test_fp8.py``):
- ``e4m3_to_f32``: equals ``torch.float8_e4m3fn -> float32`` for all 256 bytes;
  0x7F/0xFF (the e4m3fn NaN codes) decode to NaN.
- ``f32_to_e4m3``: round-to-nearest-even, saturating at +-448; for every finite fp32
  ``x`` it equals torch's conversion of ``clamp(x, -448, 448)``. NaN encodes to 0x7F
  with the input's sign bit (0x7F / 0xFF), as torch does.
- ``ue8m0_to_f32``: ``byte << 23`` reinterpreted as fp32, i.e. exactly ``2**(s-127)``
  for s in 1..254. Byte 0 decodes to +0.0 (not the denormal 2**-127) and byte 255 to
  +inf (the OCP MX NaN code). vLLM's encoder never writes either (its amax floor of
  1e-4 bounds the exponent to [-21, 127 - 127]); an inf scale makes a corrupt record
  visible as inf/NaN instead of a plausible finite value.
"""

import triton
import triton.language as tl

from deepinfer_sm80.ops._triton_utils import INTERPRETING


@triton.jit
def e4m3_to_f32(byte):
    """Decode e4m3fn bytes (uint8 values held in any integer type) to fp32, exactly.

    The byte's sign goes to fp32 bit 31 and its 7 exponent/mantissa bits to fp32 bits
    26..20; read as fp32 that is the e4m3 value times 2**-120 (an fp32 denormal when the
    e4m3 exponent is 0), so one multiply by 2**120 finishes normals and subnormals alike.
    About 8 integer/fp ops per value: the gather is ALU-bound otherwise.
    """
    b = byte.to(tl.int32)
    bits = ((b & 0x80) << 24) | ((b << 20) & 0x07F00000)
    val = bits.to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2**120
    return tl.where((b & 0x7F) == 0x7F, float("nan"), val)


@triton.jit
def f32_to_e4m3(x):
    """Encode fp32 to e4m3fn bytes (int32 in 0..255), RNE, saturating at +-448."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    is_nan = x != x
    mag = tl.minimum(tl.abs(x), 448.0)
    mbits = mag.to(tl.int32, bitcast=True)
    f32_exp = mbits >> 23
    # Normal e4m3 (mag >= 2**-6, biased fp32 exponent >= 121): round the 23-bit
    # mantissa to 3 bits, ties to even; a carry correctly bumps the exponent.
    lsb = (mbits >> 20) & 1
    r_norm = ((mbits + 0x7FFFF + lsb) >> 20) - (120 << 3)
    # Subnormal e4m3: round(mag * 2**9) to an integer 0..8, ties to even, computed on
    # the integer significand: mag * 2**9 = m * 2**(f32_exp - 141).
    m = (mbits & 0x7FFFFF) | 0x800000
    sh = tl.minimum(141 - f32_exp, 30)
    sh = tl.maximum(sh, 1)
    q = m >> sh
    rem = m & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    round_up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    r_sub = q + round_up.to(tl.int32)
    r = tl.where(f32_exp >= 121, r_norm, r_sub)
    r = tl.where(is_nan, 0x7F, r)
    return r | (sign << 7)


@triton.jit
def ue8m0_to_f32(byte):
    """Decode UE8M0 scale bytes to fp32 by integer shift: exactly 2**(s-127)."""
    return ((byte.to(tl.int32) & 0xFF) << 23).to(tl.float32, bitcast=True)


# Four e4m3 bytes and their UE8M0 scale byte -> four bf16, on the integer pipe plus two
# bf16x2 FMAs per pair. $2 holds the four data bytes, $3 four copies of the scale byte
# (the 4 columns share a 64-column scale group). Per 16-bit lane:
#   value bits  = sign << 15 | (byte & 0x7F) << 4   (= e4m3 * 2**-120 read as bf16;
#                 e4m3 subnormals become bf16 subnormals, still exact)
#   NaN codes   = exponent forced to all ones (mantissa stays non-zero: a bf16 NaN)
#   result      = value * 2**120 (exact) * 2**(s - 127) (bits s << 7; one rounding,
#                 as fp32 product then bf16 cast would do)
# sm_80 PTX only (prmt, lop3, fma.rn.bf16x2): 22 instructions for 4 values, against ~12
# per value for the fp32 path below, which is what the interpreter runs.
_E4M3X4_UE8M0_TO_BF16_PTX = tl.constexpr(
    """
{
.reg .b32 v0, v1, t0, t1, n, m0, m1, sc, k, z;
prmt.b32 v0, $2, 0, 0x1404;
prmt.b32 v1, $2, 0, 0x3424;
and.b32 n, $2, 0x7F7F7F7F;
add.u32 n, n, 0x01010101;
prmt.b32 m0, n, 0, 0x9988;
prmt.b32 m1, n, 0, 0xBBAA;
shr.b32 t0, v0, 4;
shr.b32 t1, v1, 4;
and.b32 v0, v0, 0x80008000;
and.b32 v1, v1, 0x80008000;
lop3.b32 t0, t0, 0x07F007F0, v0, 0xEA;
lop3.b32 t1, t1, 0x07F007F0, v1, 0xEA;
lop3.b32 t0, m0, 0x7F807F80, t0, 0xEA;
lop3.b32 t1, m1, 0x7F807F80, t1, 0xEA;
prmt.b32 sc, $3, 0, 0x1404;
shr.b32 sc, sc, 1;
mov.b32 k, 0x7B807B80;
mov.b32 z, 0x80008000;
fma.rn.bf16x2 t0, t0, k, z;
fma.rn.bf16x2 t1, t1, k, z;
fma.rn.bf16x2 $0, t0, sc, z;
fma.rn.bf16x2 $1, t1, sc, z;
}
"""
)


@triton.jit
def e4m3_ue8m0_to_bf16(byte, scale_byte):
    """``bf16(e4m3(byte) * 2**(scale_byte - 127))``, elementwise on uint8 tensors whose
    last dimension holds runs of 4 columns sharing one scale (V4 records: 64).

    Bit-identical to ``(e4m3_to_f32(byte) * ue8m0_to_f32(scale_byte)).to(bf16)`` for all
    256 bytes and every scale (tested on a GPU in ``tests/ops/test_fp8.py``). Compiled
    kernels run the packed PTX above; the interpreter, which cannot run PTX, the fp32
    path (the same values by that contract)."""
    if INTERPRETING:
        return (e4m3_to_f32(byte) * ue8m0_to_f32(scale_byte)).to(tl.bfloat16)
    else:
        return tl.inline_asm_elementwise(
            _E4M3X4_UE8M0_TO_BF16_PTX,
            "=r,=r,r,r",
            [byte, scale_byte],
            dtype=tl.bfloat16,
            is_pure=True,
            pack=4,
        )
