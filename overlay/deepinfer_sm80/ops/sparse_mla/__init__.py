"""Unified 512-dim sparse MLA for sm80/sm86: fp8-record decode and bf16 prefill."""

from deepinfer_sm80.ops.sparse_mla.ops import sparse_mla_decode, sparse_mla_prefill

__all__ = ["sparse_mla_decode", "sparse_mla_prefill"]
