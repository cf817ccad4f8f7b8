"""Kernels that must fail the Ampere fitness check (they prove the check can fail)."""

import triton
import triton.language as tl


@triton.jit
def uses_fp8e4nv(x_ptr, y_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    b = tl.load(x_ptr + o)
    tl.store(y_ptr + o, b.to(tl.float8e4nv, bitcast=True).to(tl.float32))


@triton.jit
def big_shared_dot(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr, K: tl.constexpr):
    o = tl.arange(0, BLOCK)
    k = tl.arange(0, K)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for i in range(0, 4):
        a = tl.load(a_ptr + i * BLOCK * K + o[:, None] * K + k[None, :])
        b = tl.load(b_ptr + i * BLOCK * K + k[:, None] * BLOCK + o[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + o[:, None] * BLOCK + o[None, :], acc)
