"""Exact e4m3fn -> fp16 by bit placement, the operand decode of the indexer's dots.

An OCP e4m3fn byte ``s eeee mmm`` (exponent bias 7) placed at fp16 bits 15 and 13..7
(``s 0eeee mmm0000000``) reads as an fp16 with exponent bias 15: the same significand,
exponent lowered by 8. So the fp16 equals the e4m3 value times ``2**-8`` exactly, for
normals and subnormals alike (an e4m3 subnormal lands on an fp16 subnormal of the same
significand), with no arithmetic: three integer operations and a select for NaN.

Why fp16 and not bf16: e4m3 values are exact in both, but reaching bf16 needs a float
multiply by ``2**120`` (bf16 keeps fp32's exponent range), about twice the integer work,
and the decode is a large share of the indexer's ALU time on sm80, where nothing decodes
fp8 in hardware. A product of two decoded operands carries ``2**-16``, which the kernels
fold into the per-key scale (exact: a power of two, far from fp32's range limits).

The e4m3fn NaN codes (0x7F, 0xFF) become fp16 NaN with the byte's sign, as torch's
``float8_e4m3fn`` conversion gives NaN; vLLM's writers clamp to +-448 and never store them.
"""

import triton
import triton.language as tl

from deepinfer_sm80.ops._triton_utils import INTERPRETING

# The decoded fp16 is the e4m3 value times this; a dot of two decoded operands carries
# its square, which kernels undo by multiplying with PRODUCT_UNSCALE.
F16_OPERAND_SCALE = 2.0**-8
PRODUCT_UNSCALE = tl.constexpr(2.0**16)


@triton.jit
def e4m3_to_f16_scaled(byte):
    """fp16 equal to the e4m3fn value of ``byte`` times 2**-8, exactly; NaN codes -> NaN."""
    b = byte.to(tl.uint16)
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    # 0x7F << 7 is 0x3F80; setting bits 14..9 makes exponent 31 with a nonzero mantissa.
    bits = tl.where((b & 0x7F) == 0x7F, bits | 0x7E00, bits)
    return bits.to(tl.float16, bitcast=True)


# The same placement on four bytes at once, two fp16 per 32-bit register (what the
# kernels run on a GPU). Per pair: a byte permute puts byte i at bits 8..15 of its half,
# so the sign is already at bit 15 and, shifted right by one, the magnitude at bits 7..13;
# NaN halves (magnitude 0x3F80, the largest) are the only ones that carry into bit 14
# when 0x80 is added, and that bit, moved to bit 9 and times 63, fills bits 9..14 (the
# exponent) as ``e4m3_to_f16_scaled`` does. 18 instructions per 4 values against about
# 8 per value unpacked: the indexer kernels took 1.06-1.6x less time with it on an H200
# (benchmarks/results/NVIDIA_H200.indexer_logits_variants.log). A CPU test runs this
# text through a small PTX model for every byte in every position.
E4M3X4_TO_F16_PTX = tl.constexpr(
    """
{
.reg .b32 t0, t1, u0, u1, v0, v1;
prmt.b32 t0, $2, 0, 0x1404;
prmt.b32 t1, $2, 0, 0x3424;
shr.b32 u0, t0, 1;
shr.b32 u1, t1, 1;
and.b32 u0, u0, 0x3F803F80;
and.b32 u1, u1, 0x3F803F80;
add.u32 v0, u0, 0x00800080;
add.u32 v1, u1, 0x00800080;
and.b32 v0, v0, 0x40004000;
and.b32 v1, v1, 0x40004000;
shr.b32 v0, v0, 5;
shr.b32 v1, v1, 5;
mul.lo.u32 v0, v0, 63;
mul.lo.u32 v1, v1, 63;
lop3.b32 t0, t0, 0x80008000, u0, 0xEA;
lop3.b32 t1, t1, 0x80008000, u1, 0xEA;
or.b32 $0, t0, v0;
or.b32 $1, t1, v1;
}
"""
)


@triton.jit
def e4m3_to_f16_scaled_packed(byte):
    """``e4m3_to_f16_scaled`` four bytes at a time (the PTX above) in compiled kernels;
    the interpreter, which cannot run PTX, takes the elementwise version. The last
    dimension of ``byte`` must hold a multiple of 4 values."""
    if INTERPRETING:
        return e4m3_to_f16_scaled(byte)
    else:
        return tl.inline_asm_elementwise(
            E4M3X4_TO_F16_PTX, "=r,=r,r", [byte], dtype=tl.float16, is_pure=True, pack=4
        )
