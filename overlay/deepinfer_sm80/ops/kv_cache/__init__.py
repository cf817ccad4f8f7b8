"""The 584-byte V4 KV record on Ampere: gather (dequantize) and insert (quantize)."""

from deepinfer_sm80.ops.kv_cache.triton_kernel import (
    dequantize_and_gather_k_cache,
    quantize_and_insert_k_cache,
)

__all__ = ["dequantize_and_gather_k_cache", "quantize_and_insert_k_cache"]
