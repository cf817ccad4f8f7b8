"""Engram table lookup on Ampere: FP8 rows decoded in software (vLLM's kernel needs sm89+)."""

from deepinfer_sm80.ops.engram.triton_kernel import (
    engram_lookup_kernel_override,
    engram_lookup_u8_kernel,
)

__all__ = ["engram_lookup_kernel_override", "engram_lookup_u8_kernel"]
