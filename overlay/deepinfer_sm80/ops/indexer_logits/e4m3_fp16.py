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
