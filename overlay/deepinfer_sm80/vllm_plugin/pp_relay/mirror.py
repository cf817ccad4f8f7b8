"""Weight-free stand-ins for an earlier stage's cache-owning layer (the same-name mirror).

A later pipeline stage registers these under the source layer's own names
(``…layers.<s>.attn`` and ``…layers.<s>.attn.indexer.k_cache``) before its decoder
layers are built. vLLM then finds the caches the consumers look up at construction,
merges the mirror's KV spec with the real one by name (the specs are equal, so the
global KV grouping does not change), allocates and binds the pages on this stage with
the same block ids as the owner, and builds attention metadata (slot mapping, block
table) under the source's name. The relay fills the pages (``relay.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.models.deepseek_v41.attention import DeepseekV4IndexerCache, _indexer_k_cache_head_dim
from vllm.v1.attention.backends.mla.indexer import dsa_indexer_uses_fp4


class _AsKVSource:
    """A consumer attention layer seen as the kv source it reads: vLLM's own
    ``get_kv_cache_spec`` then computes the source's spec from the consumer's resolved
    cache dtype, page alignment and record width (identical on every layer) and the
    source's compression ratio."""

    def __init__(self, consumer: Any, compress_ratio: int):
        self._consumer = consumer
        self.is_kv_source = True
        self.compress_ratio = compress_ratio

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


class CompressedKVMirror(torch.nn.Module, AttentionLayerBase):
    """Holds the compressed-KV cache of source layer ``source`` on a later stage."""

    def __init__(self, prefix: str, source: int, compress_ratio: int, vllm_config):
        super().__init__()
        self.prefix = prefix
        self.source = source
        self.compress_ratio = compress_ratio
        self.kv_cache = torch.tensor([])
        # A local attention layer of the same class, set once the decoder layers
        # exist; the spec is computed lazily because the first attention layer built
        # rewrites cache_config.cache_dtype ("fp8" -> "fp8_ds_mla").
        self.set_consumer(None)
        context = vllm_config.compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        context[prefix] = self

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        # vLLM allocates [blocks, heads=1, block_size, width]; the source squeezes it.
        self.kv_cache = kv_cache.squeeze(1)

    def set_consumer(self, attn: Any) -> None:
        # Plain reference, not a submodule: the consumer belongs to the model's tree.
        object.__setattr__(self, "consumer", attn)

    def _require_consumer(self) -> Any:
        if self.consumer is None:
            raise RuntimeError(
                f"pipeline relay: the mirror {self.prefix} has no local attention layer "
                "to take its cache format from; build the stage's layers first"
            )
        return self.consumer

    def get_attn_backend(self):
        return self._require_consumer().get_attn_backend()

    def get_kv_cache_spec(self, vllm_config):
        consumer = self._require_consumer()
        return type(consumer).get_kv_cache_spec(
            _AsKVSource(consumer, self.compress_ratio), vllm_config
        )

    def forward(self):  # never called: the mirror only holds pages
        raise RuntimeError(f"{self.prefix} is a pipeline-relay cache mirror, not a layer")


def compressed_record_bytes(attn: Any) -> int:
    """Bytes per compressed-KV record of any DeepSeek-V4.1 attention layer's class and
    cache dtype (584, 528 or 288 packed; 1024 / 512 plain bf16 / fp8 rows)."""
    if attn.kv_cache_dtype in ("fp8_ds_mla", "nvfp4_ds_mla"):
        return int(attn.compressed_bytes_per_token)
    return int(attn.head_dim) * torch.empty((), dtype=attn.kv_cache_torch_dtype).element_size()


def index_k_record_bytes(vllm_config) -> int:
    config = vllm_config.model_config.hf_config
    return _indexer_k_cache_head_dim(config.index_head_dim, dsa_indexer_uses_fp4(vllm_config))


def make_index_k_mirror(prefix: str, compress_ratio: int, vllm_config) -> DeepseekV4IndexerCache:
    """vLLM's own index-K cache module under the source's name: it registers itself and
    computes the same spec and backend as the source's."""
    return DeepseekV4IndexerCache(
        head_dim=index_k_record_bytes(vllm_config),
        dtype=torch.uint8,
        prefix=prefix,
        cache_config=vllm_config.cache_config,
        compress_ratio=compress_ratio,
    )
