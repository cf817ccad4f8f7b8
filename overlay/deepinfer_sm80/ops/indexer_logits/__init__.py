"""DeepSeek-V4.1 sparse-indexer logits (FP8 index K) for sm80/sm86."""

from deepinfer_sm80.ops.indexer_logits.deep_gemm_compat import (
    fp8_fp4_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    get_paged_mqa_logits_metadata,
)
from deepinfer_sm80.ops.indexer_logits.triton_kernel import mqa_logits_into, paged_mqa_logits_into

__all__ = [
    "fp8_fp4_mqa_logits",
    "fp8_fp4_paged_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "mqa_logits_into",
    "paged_mqa_logits_into",
]
