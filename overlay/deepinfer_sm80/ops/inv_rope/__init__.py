"""Inverse RoPE (+ optional fp8 quantization) before wo_a (vLLM: fused_inv_rope_fp8_quant)."""

from deepinfer_sm80.ops.inv_rope.triton_kernel import fused_inv_rope_fp8_quant

__all__ = ["fused_inv_rope_fp8_quant"]
