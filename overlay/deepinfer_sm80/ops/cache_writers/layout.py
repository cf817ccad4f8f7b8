"""The indexer K cache record (vLLM 0.33.0, DeepSeek-V4.1 with its default FP8 indexer cache).

One record per compressed position: 128 e4m3fn values and one fp32 scale (a power of
two), 132 bytes. A page of ``block_size`` records keeps the values of every record
first, then the scales, then padding up to ``k_cache.stride(0)``:

    values (block_size x 128 B) | scales (block_size x 4 B, fp32) | padding

vLLM pads indexer pages like the KV pages of the same block (576-byte multiples with
the V4 record). Source: ``vllm/models/deepseek_v41/common/ops/indexer_k_store.py``
and ``attention.py`` (``_indexer_k_cache_head_dim``, ``DeepseekV4IndexerCache``).

The compressed KV cache uses the 584-byte V4 record of ``ops/kv_cache/layout.py``.
"""

from deepinfer_sm80.ops.kv_cache.layout import PAGE_ALIGNMENT

INDEX_HEAD_DIM = 128
INDEX_ROPE_DIM = 64  # the last 64 of the 128 dims, GPT-J interleaved pairs
INDEX_SCALE_BYTES = 4
INDEX_RECORD_BYTES = INDEX_HEAD_DIM + INDEX_SCALE_BYTES  # 132
# vLLM's other indexer record (indexer_kv_dtype="mxfp4"): 64 B of e2m1 pairs + 4 UE8M0.
INDEX_MXFP4_RECORD_BYTES = 68

# The compressor's latent: 448 NoPE dims then 64 RoPE dims.
LATENT_DIM = 512


def index_page_bytes(block_size: int, alignment: int = PAGE_ALIGNMENT) -> int:
    """Bytes of one indexer page as vLLM allocates it next to V4-record KV pages."""
    raw = block_size * INDEX_RECORD_BYTES
    return -(-raw // alignment) * alignment
