"""Sparse-MLA index preparation: Top-K + SWA combination and global Top-K slots."""

from deepinfer_sm80.ops.topk_swa.triton_kernel import (
    combine_topk_swa_indices,
    compute_global_topk_indices_and_lens,
)

__all__ = ["combine_topk_swa_indices", "compute_global_topk_indices_and_lens"]
