"""Indexer K writer for sm80/sm86: k_norm -> RoPE -> e4m3 + fp32 scale -> paged store.

Replaces ``indexer_k_norm_rope_store`` of vLLM 0.33.0
(``vllm/models/deepseek_v41/common/ops/indexer_k_store.py``), whose kernel converts to
``tl.float8e4nv`` and so cannot compile below sm_89. Same signature and semantics for
the FP8 indexer cache, the only one Ampere can use (see ``indexer_k_norm_rope_store``).
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.ops._validate import check_int, check_paged_records, check_tensor
from deepinfer_sm80.ops.cache_writers.layout import (
    INDEX_HEAD_DIM,
    INDEX_MXFP4_RECORD_BYTES,
    INDEX_RECORD_BYTES,
    INDEX_ROPE_DIM,
)
from deepinfer_sm80.ops.cache_writers.triton_kernel import (
    bf16_rne,
    e4m3_saturated,
    kernel_config,
    ue8m0_exponent,
)


@triton.jit
def indexer_k_fp8_store_kernel(
    k_pre_ptr,
    k_pre_stride,
    positions_ptr,
    weight_ptr,
    eps,
    cos_sin_ptr,
    cos_sin_stride,
    cache_ptr,
    page_stride,
    slot_mapping_ptr,
    block_size,
    COMPRESS_RATIO: tl.constexpr,
):
    # One program per token. The norm and RoPE keep vLLM's expressions and tile shapes
    # (a [128] row, split into [64] even/odd halves) so that, compiled, they are its
    # instructions: same fp32 summation tree, same FMA contraction, same rsqrt.
    HEAD: tl.constexpr = 128
    PAIRS: tl.constexpr = 64
    NOPE_PAIRS: tl.constexpr = 32  # dims 0..63 are not rotated
    ROPE_PAIRS: tl.constexpr = 32  # the cache row holds 32 cos, then 32 sin
    i_t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + i_t).to(tl.int64)
    if slot < 0:
        return
    pos = tl.load(positions_ptr + i_t)
    # A group's key is published by its last token only.
    if (pos + 1) % COMPRESS_RATIO != 0:
        return

    o_d = tl.arange(0, HEAD)
    x = tl.load(k_pre_ptr + i_t * k_pre_stride + o_d).to(tl.float32)
    w = tl.load(weight_ptr + o_d).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / HEAD
    x = bf16_rne(x * tl.rsqrt(mean_sq + eps) * w)

    # GPT-J RoPE at the group's first position. The NoPE pairs go through the same
    # formula with (cos, sin) = (1, 0), as in vLLM: that is the identity except for the
    # sign of a zero next to a negative partner, and a NaN next to an infinite one.
    even, odd = tl.split(tl.reshape(x, (PAIRS, 2)))
    o_rope = tl.arange(0, PAIRS) - NOPE_PAIRS
    is_rope = o_rope >= 0
    o_cs = tl.maximum(o_rope, 0)
    p_cs = cos_sin_ptr + (pos // COMPRESS_RATIO * COMPRESS_RATIO) * cos_sin_stride
    cos = tl.load(p_cs + o_cs, mask=is_rope, other=1.0)
    sin = tl.load(p_cs + ROPE_PAIRS + o_cs, mask=is_rope, other=0.0)
    key = tl.interleave(bf16_rne(even * cos - odd * sin), bf16_rne(odd * cos + even * sin))

    # One power-of-two scale for the whole row; e4m3 values, saturating.
    exponent = ue8m0_exponent(tl.max(tl.abs(key), axis=0))
    q = e4m3_saturated(key * tl.exp2(-exponent))

    p_page = cache_ptr + (slot // block_size) * page_stride
    row = slot % block_size
    tl.store(p_page + row * HEAD + o_d, q.to(tl.uint8))
    p_scale = (p_page + block_size * HEAD + row * 4).to(tl.pointer_type(tl.float32))
    tl.store(p_scale, tl.exp2(exponent))


def _check_cache(k_cache: torch.Tensor) -> None:
    check_tensor("k_cache", k_cache, dtype=torch.uint8, ndim=3)
    width = k_cache.shape[-1]
    if width == INDEX_MXFP4_RECORD_BYTES:
        raise ValueError(
            f"k_cache: {width}-byte records are vLLM's MXFP4 indexer cache, written with "
            "cvt.rn.satfinite.e2m1x2 (sm_100+ only); on Ampere keep the FP8 indexer "
            "cache (attention_config indexer_kv_dtype 'auto' or 'fp8')"
        )
    if width != INDEX_RECORD_BYTES:
        raise ValueError(
            f"k_cache: expected {INDEX_RECORD_BYTES}-byte FP8 indexer records (128 e4m3 + "
            f"fp32 scale) in the last dimension, got shape {tuple(k_cache.shape)}"
        )
    check_paged_records("k_cache", k_cache, INDEX_RECORD_BYTES)


def indexer_k_norm_rope_store(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
    use_fp4_cache: bool,
) -> None:
    """Normalize, rotate, quantize and store index keys (vLLM 0.33.0 semantics).

    Token ``i < len(kv_slot_mapping)`` publishes a key when its slot is not negative
    and ``(positions[i] + 1) % compress_ratio == 0`` (the last token of a group):
    ``k = bf16(rmsnorm(k_pre[i]) * weight)``, then GPT-J RoPE on dims 64..127 at
    position ``positions[i] // ratio * ratio`` (rounded to bf16), then one scale
    ``2**ceil(log2(max(amax, 1e-4) / 448))`` and 128 e4m3 values (RNE, saturating).
    The record's 128 value bytes and 4 scale bytes are all that is written.

    Args:
        k_pre: ``[>= T, 128]`` bf16, unit column stride (the ``wk(latent)`` output).
        positions: ``[>= T]`` int64 (int32 accepted) token positions.
        cos_sin_cache: ``[max_pos, 64]`` fp32 (bf16 accepted): 32 cos then 32 sin.
        rms_norm_weight: ``[128]`` k_norm weight (bf16 or fp32).
        rms_norm_eps: k_norm epsilon.
        k_cache: ``[num_blocks, block_size, 132]`` uint8, pages ``stride(0)`` bytes
            apart (values, then fp32 scales, then padding).
        kv_slot_mapping: ``[T]`` int64 (int32 accepted) indexer-cache slots, -1 = skip.
        compress_ratio: group size, 1 or 2.
        use_fp4_cache: must be False; vLLM's MXFP4 indexer cache needs sm_100.
    """
    if use_fp4_cache:
        raise ValueError(
            "use_fp4_cache: vLLM's MXFP4 indexer cache packs values with "
            "cvt.rn.satfinite.e2m1x2, an sm_100+ instruction; on Ampere keep the FP8 "
            "indexer cache (attention_config indexer_kv_dtype 'auto' or 'fp8')"
        )
    compress_ratio = check_int("compress_ratio", compress_ratio, minimum=1)
    if compress_ratio not in (1, 2):
        raise ValueError(
            f"compress_ratio: expected 1 or 2 (V4.1 group sizes), got {compress_ratio}"
        )
    if not isinstance(rms_norm_eps, (int, float)) or isinstance(rms_norm_eps, bool):
        raise ValueError(f"rms_norm_eps: expected a float, got {rms_norm_eps!r}")
    _check_cache(k_cache)
    dev = k_cache.device
    check_tensor("k_pre", k_pre, dtype=torch.bfloat16, ndim=2, device=dev)
    if k_pre.shape[1] != INDEX_HEAD_DIM or k_pre.stride(1) != 1:
        raise ValueError(
            f"k_pre: expected [T, {INDEX_HEAD_DIM}] with unit column stride, got shape "
            f"{tuple(k_pre.shape)} strides {k_pre.stride()}"
        )
    check_tensor("positions", positions, dtype=(torch.int64, torch.int32), ndim=1, device=dev)
    check_tensor("cos_sin_cache", cos_sin_cache, dtype=(torch.float32, torch.bfloat16), ndim=2)
    if cos_sin_cache.device != dev:
        raise ValueError(f"cos_sin_cache: expected a tensor on {dev}, got {cos_sin_cache.device}")
    if cos_sin_cache.shape[1] != INDEX_ROPE_DIM or cos_sin_cache.stride(1) != 1:
        raise ValueError(
            f"cos_sin_cache: expected [max_pos, {INDEX_ROPE_DIM}] (cos half, sin half) with "
            f"unit column stride, got shape {tuple(cos_sin_cache.shape)}"
        )
    check_tensor(
        "rms_norm_weight",
        rms_norm_weight,
        dtype=(torch.bfloat16, torch.float32),
        ndim=1,
        device=dev,
    )
    if rms_norm_weight.shape[0] != INDEX_HEAD_DIM or rms_norm_weight.stride(0) != 1:
        raise ValueError(
            f"rms_norm_weight: expected {INDEX_HEAD_DIM} contiguous values, got shape "
            f"{tuple(rms_norm_weight.shape)}"
        )
    check_tensor(
        "kv_slot_mapping", kv_slot_mapping, dtype=(torch.int64, torch.int32), ndim=1, device=dev
    )
    num_tokens = kv_slot_mapping.shape[0]
    if num_tokens > k_pre.shape[0] or num_tokens > positions.shape[0]:
        raise ValueError(
            f"kv_slot_mapping: maps {num_tokens} tokens but k_pre has {k_pre.shape[0]} rows "
            f"and positions {positions.shape[0]} entries"
        )
    if num_tokens == 0:
        return
    cfg = kernel_config("cache_writers.indexer_k")
    indexer_k_fp8_store_kernel[(num_tokens,)](
        k_pre,
        k_pre.stride(0),
        positions,
        rms_norm_weight,
        float(rms_norm_eps),
        cos_sin_cache,
        cos_sin_cache.stride(0),
        k_cache,
        k_cache.stride(0),
        kv_slot_mapping,
        k_cache.shape[1],
        COMPRESS_RATIO=compress_ratio,
        **cfg.launch_options(),
    )


__all__ = ["indexer_k_fp8_store_kernel", "indexer_k_norm_rope_store"]
