"""FlashMLA-signature entry points over the Ampere sparse MLA kernels.

vLLM 0.33.0 calls FlashMLA's ``flash_mla_with_kvcache`` (sparse fp8 decode) and
``flash_mla_sparse_fwd`` (prefill) from ``vllm/models/deepseek_v41/nvidia/flashmla.py``;
these functions take the same parameters (names, order, defaults -- checked against
vLLM's vendored ``third_party/flashmla/flash_mla_interface.py`` in the tests) and return
what those return, so the plugin can rebind them where they are used.

Only the sparse modes DeepSeek-V4.1 uses are served: dense attention (``block_table``,
``cache_seqlens``, ``causal``) and non-fp8 caches are refused with a clear error.
``tile_scheduler_metadata`` and ``num_splits`` are FlashMLA's scheduler and are ignored:
our split count follows each token's own rows (batch-invariant), so
``enable_batch_invariant`` is always satisfied. The padded heads of ``q`` are attended
like the others (FlashMLA's call does not say how many are real); the attention class
that knows ``n_local_heads`` should call ``sparse_mla_decode(num_heads=...)`` instead.
"""

from __future__ import annotations

import torch

from deepinfer_sm80.ops.sparse_mla.triton_kernel import sparse_mla_decode, sparse_mla_prefill


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    enable_batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse fp8 decode. Returns ``(out [B, 1, H, 512], lse [B, H, 1])``."""
    if block_table is not None or cache_seqlens is not None or causal:
        raise ValueError(
            "flash_mla_with_kvcache: only sparse attention is served on Ampere "
            "(pass indices; block_table, cache_seqlens and causal must be unset)"
        )
    if indices is None or not is_fp8_kvcache:
        raise ValueError(
            "flash_mla_with_kvcache: needs indices and is_fp8_kvcache=True (the 584-byte V4 record)"
        )
    if head_dim_v != 512:
        raise ValueError(f"head_dim_v: DeepSeek-V4.1 uses 512, got {head_dim_v}")
    if q.dim() != 4 or q.shape[1] != 1:
        raise ValueError(
            f"q: expected [B, 1, H, 512] (one query per sequence), got {tuple(q.shape)}"
        )
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    result, lse = sparse_mla_decode(
        q[:, 0], k_cache, indices, topk_length, scale, attn_sink, extra_k_cache,
        extra_indices_in_kvcache, extra_topk_length,
        out=None if out is None else out[:, 0],
    )  # fmt: skip
    return result.unsqueeze(1) if out is None else out, lse.unsqueeze(-1)


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill. Returns ``(out, max_logits, lse)`` like FlashMLA."""
    if d_v != 512:
        raise ValueError(f"d_v: DeepSeek-V4.1 uses 512, got {d_v}")
    return sparse_mla_prefill(q, kv, indices, sm_scale, attn_sink, topk_length, out=out)
