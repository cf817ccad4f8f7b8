"""``vllm.utils.deep_gemm``-signature entry points over the Ampere indexer kernels.

vLLM 0.33.0's sparse indexer (``vllm/model_executor/layers/sparse_attn_indexer.py``)
scores candidates with ``fp8_fp4_mqa_logits`` (prefill) and ``fp8_fp4_paged_mqa_logits``
(decode), and its metadata builder (``vllm/v1/attention/backends/mla/indexer.py``) calls
``get_paged_mqa_logits_metadata`` for every decode batch: all three are DeepGEMM
kernels with sm_90+ code only. These functions take the same parameters (names, order,
defaults, annotations: checked with ``inspect.signature`` in the tests) and return what
vLLM's callers consume on a non-sm_100 GPU: fp32 logits, DeepGEMM's layouts.

Only the FP8 index cache is served, which is what vLLM selects below sm_100
(``dsa_indexer_uses_fp4`` raises for ``indexer_kv_dtype='mxfp4'`` there): MXFP4 inputs
(a query scale tensor, int8 packed values, int32 MX key scales) and the sm_100 varlen
decode form (``indices``) are refused with a clear error. ``schedule_metadata`` is
DeepGEMM's SM scheduler and is ignored: our split count follows the shapes only.

No host synchronisation and no data-dependent allocation: decode runs inside vLLM's
CUDA graphs.
"""

import torch

from deepinfer_sm80.ops._validate import check_int
from deepinfer_sm80.ops.indexer_logits.triton_kernel import mqa_logits_into, paged_mqa_logits_into

_SM100_ONLY = "is sm_100-only in vLLM 0.33.0; Ampere runs the FP8 indexer (q_scale=None)"


def _pair(name: str, value: object) -> tuple:
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ValueError(f"{name}: expected a (values, scales) pair, got {type(value).__name__}")
    return tuple(value)


def fp8_fp4_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    max_seqlen_k: int,
) -> torch.Tensor:
    """Prefill logits ``[M, max_seqlen_k]`` fp32, DeepGEMM's compressed layout.

    ``q = (values [M, H, D] e4m3fn, None)``, ``kv = (k [N, D] e4m3fn, k_scale [N]
    fp32)``, ``weights [M, H]`` fp32. Row ``m`` holds keys ``[ks[m], ke[m])`` from
    column 0; later columns are -inf (DeepGEMM leaves them unset; nothing reads them).
    """
    q_values, q_scale = _pair("q", q)
    if q_scale is not None:
        raise ValueError(f"q: a query scale tensor (MX-scaled FP8/MXFP4) {_SM100_ONLY}")
    k, k_scale = _pair("kv", kv)
    width = check_int("max_seqlen_k", max_seqlen_k, minimum=0)
    if not isinstance(q_values, torch.Tensor) or q_values.dim() != 3:
        raise ValueError("q: expected values of shape [M, H, D]")
    out = torch.empty((q_values.shape[0], width), dtype=torch.float32, device=q_values.device)
    return mqa_logits_into(out, q_values, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke)


def get_paged_mqa_logits_metadata(
    context_lens: torch.Tensor,
    block_size: int,
    num_sms: int,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeepGEMM's scheduling metadata, which our decode kernel does not use.

    Returns zeros of the shape vLLM's builder copies into its buffer (``[num_sms + 1, 2]``
    int32, one slot per SM as DeepGEMM sizes it off sm_90 ``next_n == 4``), so the
    builder's bookkeeping is unchanged.
    """
    check_int("num_sms", num_sms, minimum=1)
    if indices is not None:
        raise ValueError(f"indices: the varlen paged MQA logits form {_SM100_ONLY}")
    return torch.zeros((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)


def fp8_fp4_paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor,
    max_model_len: int,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode logits ``[B * next_n, max_model_len]`` fp32 from the paged index cache.

    ``q = (values [B, next_n, H, D] e4m3fn, None)``, ``kv_cache [blocks, block_size, 1,
    D + 4]`` uint8, ``weights [B * next_n, H]`` fp32, ``context_lens [B]``, ``[B, 1]`` or
    ``[B, next_n]`` int32. Columns below each row's length hold its logits, -inf up to
    its request's longest row; later columns are not written (as DeepGEMM).
    """
    q_values, q_scale = _pair("q", q)
    if q_scale is not None:
        raise ValueError(f"q: a query scale tensor (MX-scaled FP8/MXFP4) {_SM100_ONLY}")
    if indices is not None:
        raise ValueError(f"indices: the varlen paged MQA logits form {_SM100_ONLY}")
    width = check_int("max_model_len", max_model_len, minimum=0)
    if not isinstance(q_values, torch.Tensor) or q_values.dim() != 4:
        raise ValueError("q: expected values of shape [B, next_n, H, D]")
    rows = q_values.shape[0] * q_values.shape[1]
    out = torch.empty((rows, width), dtype=torch.float32, device=q_values.device)
    return paged_mqa_logits_into(out, q_values, kv_cache, weights, context_lens, block_tables)


__all__ = ["fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata"]
