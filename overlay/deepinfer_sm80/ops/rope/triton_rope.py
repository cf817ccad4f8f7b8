"""Triton device functions for GPT-J RoPE rounded the way vLLM's kernels round it.

Shared by the index-Q quantizer (forward RoPE) and the output projection's inverse RoPE.

**Contraction.** vLLM 0.33.0's Triton kernels write RoPE as sums of two products and
let the compiler contract them; Triton 3.8 (the version vLLM 0.33.0 pins) rounds one
product and fuses the other (read in their sm_90 PTX; the forward kernel's operands
are checked on CPU by ``tests/ops/test_indexer_q.py``, the inverse kernel's FMA count by
``test_inv_rope.py``, and both bit for bit against vLLM's kernels in the GPU tier):
- the inverse kernel: both lanes ``fma(x, cos, +/-(partner * sin))``: ``rotate``;
- the forward kernel (index Q): the even output the same, but the odd one,
  ``o * cos + e * sin``, as ``fma(e, sin, o * cos)``: ``rotate_cos_first``.
These helpers write those fused multiply-adds explicitly, so the GPU result does not
depend on what the compiler chooses to contract, and equals vLLM's bit for bit. Triton's
CPU interpreter evaluates ``tl.fma`` as a rounded product plus a rounded sum, which is
exactly what vLLM's kernels and PyTorch compute there: ``ref.py`` models both
(``contract=True`` / ``False``).

**bf16 rounding.** Triton's interpreter truncates fp32 -> bf16 (and mishandles bf16
subnormals), while GPUs and PyTorch round to nearest even. These helpers convert between
fp32 and bf16 on the bits, so the interpreter and the GPU compute the same values.
"""

import triton
import triton.language as tl


@triton.jit
def rotate(x, partner, cos, sin_signed):
    """One RoPE output: ``fma(x, cos, partner * sin_signed)`` in fp32.

    Forward RoPE of a pair (even, odd): even' = rotate(even, odd, cos, -sin); the
    inverse negates ``sin``. Negating a factor is
    exact, so ``partner * -sin`` has the bits of ``-(partner * sin)``.
    """
    return tl.fma(x, cos, partner * sin_signed)


@triton.jit
def rotate_cos_first(x, partner, cos, sin_signed):
    """One RoPE output with the other contraction: ``fma(partner, sin_signed, x * cos)``,
    the product with ``cos`` rounded first (vLLM's forward kernel's odd output)."""
    return tl.fma(partner, sin_signed, x * cos)


@triton.jit
def bf16_bits_rne(x):
    """fp32 -> bf16 bits (int32 holding 0..65535), round to nearest even; NaN stays NaN."""
    bits = x.to(tl.int32, bitcast=True)
    # Adding 0x7FFF plus the kept LSB carries into bit 16 exactly when RNE rounds up;
    # the arithmetic shift's sign-extension is masked off.
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    quiet_nan = ((bits >> 16) & 0xFFFF) | 0x40
    return tl.where(x != x, quiet_nan, rounded)


@triton.jit
def round_to_bf16(x):
    """The fp32 value of ``x`` rounded to bf16 (nearest even)."""
    return (bf16_bits_rne(x) << 16).to(tl.float32, bitcast=True)


@triton.jit
def to_bf16(x):
    """``x`` rounded to a bf16 tensor (nearest even), for stores into bf16 buffers."""
    return bf16_bits_rne(x).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def load_f32(ptrs, mask):
    """Load bf16 (exactly, through the bits) or fp32 values as fp32; masked lanes are 0."""
    b_x = tl.load(ptrs, mask=mask, other=0.0)
    if b_x.dtype == tl.bfloat16:
        b_bits = b_x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        return (b_bits << 16).to(tl.float32, bitcast=True)
    else:
        return b_x.to(tl.float32)
