"""fp8e4nv-free writers of DeepSeek-V4.1's indexer K cache and compressed KV cache."""

from deepinfer_sm80.ops.cache_writers.compressed_kv import rope_quant_insert
from deepinfer_sm80.ops.cache_writers.indexer_k import indexer_k_norm_rope_store

__all__ = ["indexer_k_norm_rope_store", "rope_quant_insert"]
