"""Index-Q RoPE + fp8 quantization for the sparse indexer (vLLM: fused_indexer_q_rope_quant)."""

from deepinfer_sm80.ops.indexer_q.triton_kernel import fused_indexer_q_rope_quant

__all__ = ["fused_indexer_q_rope_quant"]
