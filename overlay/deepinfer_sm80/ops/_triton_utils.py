"""Helpers shared by the Triton kernels.

``mma`` is ``tl.dot`` with fp32 accumulation. Triton's CPU interpreter returns garbage
for bf16 ``tl.dot``, so under ``TRITON_INTERPRET=1`` (and only there) the operands are
upcast to fp32 first; compiled kernels always run the bf16 Tensor Core path.
"""

import os

import triton
import triton.language as tl

INTERPRETING = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def mma(a, b):
    if INTERPRETING:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)
