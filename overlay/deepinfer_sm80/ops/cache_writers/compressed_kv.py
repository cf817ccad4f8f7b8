"""Compressed KV writer for sm80/sm86: GPT-J RoPE + quantize + paged store of a latent.

Replaces ``rope_quant_insert`` of vLLM 0.33.0
(``vllm/models/deepseek_v41/common/ops/fused_compress_quant_cache.py``), whose V4
record kernel converts to ``tl.float8e4nv`` (sm89+). Same signature and semantics for
every cache Ampere can hold:

- ``uint8`` cache of 584-byte V4 records (``fp8_ds_mla``, the only packed record off
  SM100 and vLLM's default): 448 e4m3 NoPE values with 7 UE8M0 scales, 64 bf16 RoPE
  values. ``compressed_kv_v4_record_kernel``.
- plain rows, bf16 or per-tensor-scaled ``float8_e4m3fn`` (the FlashInfer layouts):
  ``compressed_kv_plain_row_kernel``. vLLM's bf16 variant compiles on sm80 as it is;
  its fp8 variant does not. Both are here so one function serves every layout.

The 528-byte MXFP8 and 288-byte NVFP4 V4.1 records exist only on SM100 (vLLM selects
them there alone) and are refused with an explanation.
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.ops._validate import check_int, check_paged_records, check_tensor
from deepinfer_sm80.ops.cache_writers.layout import LATENT_DIM
from deepinfer_sm80.ops.cache_writers.triton_kernel import (
    bf16_rne,
    bf16_rne_bits,
    e4m3_saturated,
    kernel_config,
    ue8m0_exponent,
)
from deepinfer_sm80.ops.kv_cache.layout import (
    RECORD_BYTES,
    ROPE_DIM,
    V41_MXFP8_RECORD_BYTES,
    V41_NVFP4_RECORD_BYTES,
)


@triton.jit
def compressed_kv_v4_record_kernel(
    latent_ptr,
    latent_stride,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    cache_ptr,
    page_stride,
    slot_mapping_ptr,
    block_size,
    COMPRESS_RATIO: tl.constexpr,
):
    i_t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + i_t).to(tl.int64)
    if slot < 0:
        return
    pos = tl.load(positions_ptr + i_t)
    # A group's latent is published by its last token only.
    if (pos + 1) % COMPRESS_RATIO != 0:
        return
    p_latent = latent_ptr + i_t.to(tl.int64) * latent_stride
    p_page = cache_ptr + (slot // block_size) * page_stride
    row = slot % block_size
    p_data = p_page + row * 576
    p_scale = p_page + block_size * 576 + row * 8

    # NoPE: 7 groups of 64 dims, one UE8M0 scale each. The tile has 8 groups to keep
    # shapes powers of two; the 8th is masked off (its scale slot is the pad byte, 0).
    o_g = tl.arange(0, 8)
    o_j = tl.arange(0, 64)
    m_g = o_g < 7
    o_col = o_g[:, None] * 64 + o_j[None, :]
    x = tl.load(p_latent + o_col, mask=m_g[:, None], other=0.0).to(tl.float32)
    exponent = ue8m0_exponent(tl.max(tl.abs(x), axis=1))  # [8]
    q = e4m3_saturated(x * tl.exp2(-exponent)[:, None])
    tl.store(p_data + o_col, q.to(tl.uint8), mask=m_g[:, None])
    scale_byte = tl.minimum(tl.maximum(exponent + 127.0, 0.0), 255.0).to(tl.uint8)
    tl.store(p_scale + o_g, tl.where(m_g, scale_byte, 0).to(tl.uint8))

    # RoPE: the last 64 dims as 32 GPT-J pairs, rotated at the group's first position
    # with vLLM's expressions (same FMA contraction once compiled), stored as bf16.
    o_p = tl.arange(0, 32)
    rope = tl.load(p_latent + 448 + tl.arange(0, 64)).to(tl.float32)
    even, odd = tl.split(tl.reshape(rope, (32, 2)))
    p_cs = cos_sin_ptr + (pos // COMPRESS_RATIO * COMPRESS_RATIO) * cos_sin_stride
    cos = tl.load(p_cs + o_p).to(tl.float32)
    sin = tl.load(p_cs + 32 + o_p).to(tl.float32)
    rotated = tl.interleave(even * cos - odd * sin, odd * cos + even * sin)
    p_rope = (p_data + 448).to(tl.pointer_type(tl.int16))
    tl.store(p_rope + tl.arange(0, 64), bf16_rne_bits(rotated))


@triton.jit
def compressed_kv_plain_row_kernel(
    latent_ptr,
    latent_stride,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    cache_ptr,
    page_stride,
    row_stride,
    slot_mapping_ptr,
    block_size,
    fp8_scale_ptr,
    COMPRESS_RATIO: tl.constexpr,
    STORE_FP8: tl.constexpr,
):
    # cache_ptr is the cache's int16 view (bf16 rows) or uint8 view (fp8 rows): values
    # are stored as bit patterns, so no fp8 type appears in the kernel.
    i_t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + i_t).to(tl.int64)
    if slot < 0:
        return
    pos = tl.load(positions_ptr + i_t)
    if (pos + 1) % COMPRESS_RATIO != 0:
        return
    o_d = tl.arange(0, 512)
    x = tl.load(latent_ptr + i_t.to(tl.int64) * latent_stride + o_d).to(tl.float32)
    # All 256 pairs go through the rotation, NoPE pairs with (cos, sin) = (1, 0), as in
    # vLLM (the identity up to signed zeros and inf/NaN partners).
    even, odd = tl.split(tl.reshape(x, (256, 2)))
    o_rope = tl.arange(0, 256) - 224
    is_rope = o_rope >= 0
    o_cs = tl.maximum(o_rope, 0)
    p_cs = cos_sin_ptr + (pos // COMPRESS_RATIO * COMPRESS_RATIO) * cos_sin_stride
    cos = tl.load(p_cs + o_cs, mask=is_rope, other=1.0).to(tl.float32)
    sin = tl.load(p_cs + 32 + o_cs, mask=is_rope, other=0.0).to(tl.float32)
    rotated = tl.interleave(even * cos - odd * sin, odd * cos + even * sin)
    p_row = cache_ptr + (slot // block_size) * page_stride + (slot % block_size) * row_stride
    if STORE_FP8:
        # bf16 row divided by the per-tensor scale, then e4m3 (saturating).
        scaled = bf16_rne(rotated) * (1.0 / tl.load(fp8_scale_ptr))
        tl.store(p_row + o_d, e4m3_saturated(scaled).to(tl.uint8))
    else:
        tl.store(p_row + o_d, bf16_rne_bits(rotated))


def _check_common(latent, positions, cos_sin_cache, slot_mapping, compress_ratio, dev) -> int:
    compress_ratio = check_int("compress_ratio", compress_ratio, minimum=1)
    if compress_ratio not in (1, 2):
        raise ValueError(
            f"compress_ratio: expected 1 or 2 (V4.1 group sizes), got {compress_ratio}"
        )
    check_tensor("latent", latent, dtype=torch.bfloat16, ndim=2, device=dev)
    if latent.shape[1] != LATENT_DIM or latent.stride(1) != 1:
        raise ValueError(
            f"latent: expected [T, {LATENT_DIM}] with unit column stride, got shape "
            f"{tuple(latent.shape)} strides {latent.stride()}"
        )
    check_tensor("positions", positions, dtype=(torch.int64, torch.int32), ndim=1, device=dev)
    check_tensor(
        "cos_sin_cache", cos_sin_cache, dtype=(torch.float32, torch.bfloat16), ndim=2, device=dev
    )
    if cos_sin_cache.shape[1] != ROPE_DIM or cos_sin_cache.stride(1) != 1:
        raise ValueError(
            f"cos_sin_cache: expected [max_pos, {ROPE_DIM}] (cos half, sin half) with unit "
            f"column stride, got shape {tuple(cos_sin_cache.shape)}"
        )
    check_tensor("slot_mapping", slot_mapping, dtype=(torch.int64, torch.int32), ndim=1, device=dev)
    num_tokens = slot_mapping.shape[0]
    if num_tokens > latent.shape[0] or num_tokens > positions.shape[0]:
        raise ValueError(
            f"slot_mapping: maps {num_tokens} tokens but latent has {latent.shape[0]} rows "
            f"and positions {positions.shape[0]} entries"
        )
    return num_tokens


def _check_record_cache(kv_cache: torch.Tensor) -> None:
    check_tensor("kv_cache", kv_cache, ndim=3)
    width = kv_cache.shape[-1]
    if width in (V41_MXFP8_RECORD_BYTES, V41_NVFP4_RECORD_BYTES):
        raise ValueError(
            f"kv_cache: {width}-byte records are vLLM's V4.1 MXFP8/NVFP4 formats, which "
            f"it selects on SM100 only; on Ampere vLLM 0.33.0 writes the {RECORD_BYTES}-"
            "byte V4 record (--kv-cache-dtype fp8 -> fp8_ds_mla)"
        )
    if width != RECORD_BYTES:
        raise ValueError(
            f"kv_cache: expected {RECORD_BYTES}-byte V4 records in the last dimension, got "
            f"shape {tuple(kv_cache.shape)}"
        )
    check_paged_records("kv_cache", kv_cache, RECORD_BYTES)


def _check_plain_cache(kv_cache: torch.Tensor, fp8_scale: torch.Tensor | None) -> None:
    check_tensor("kv_cache", kv_cache, ndim=3)
    if kv_cache.shape[-1] != LATENT_DIM or kv_cache.stride(-1) != 1:
        raise ValueError(
            f"kv_cache: plain rows must be [num_blocks, block_size, {LATENT_DIM}] with unit "
            f"last stride, got shape {tuple(kv_cache.shape)}"
        )
    if kv_cache.dtype == torch.float8_e4m3fn:
        if fp8_scale is None:
            raise ValueError(
                "fp8_scale: a float8_e4m3fn cache stores rows divided by a per-tensor "
                "scale; pass it as a 1-element float32 tensor"
            )
        check_tensor("fp8_scale", fp8_scale, dtype=torch.float32, device=kv_cache.device)
        if fp8_scale.numel() != 1:
            raise ValueError(f"fp8_scale: expected 1 element, got shape {tuple(fp8_scale.shape)}")


def rope_quant_insert(
    latent: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    compress_ratio: int,
    fp8_scale: torch.Tensor | None = None,
) -> None:
    """Rotate and publish compressed latents into the compressed KV cache (vLLM 0.33.0).

    Token ``i < len(slot_mapping)`` is written when its slot is not negative and
    ``(positions[i] + 1) % compress_ratio == 0``. The last 64 latent dims get GPT-J
    RoPE at position ``positions[i] // ratio * ratio``. The cache dtype picks the
    layout:

    - ``uint8`` ``[num_blocks, block_size, 584]``, pages ``stride(0)`` bytes apart (V4
      record): NoPE dims 0..447 as e4m3 with one UE8M0 scale per 64 dims
      (``ceil(log2(max(amax, 1e-4) / 448))``, RNE, saturating), RoPE dims as bf16, the
      scale row's 8th byte 0. All 584 bytes of the record are written.
    - ``bfloat16`` ``[num_blocks, block_size, 512]``: the rotated row in bf16.
    - ``float8_e4m3fn`` ``[num_blocks, block_size, 512]``: the bf16 row times
      ``1 / fp8_scale``, as e4m3 (RNE, saturating).

    Args:
        latent: ``[>= T, 512]`` bf16, unit column stride (normalized compressor output).
        positions: ``[>= T]`` int64 (int32 accepted) token positions.
        cos_sin_cache: ``[max_pos, 64]`` fp32 (bf16 accepted): 32 cos then 32 sin.
        kv_cache: the compressed cache, as above.
        slot_mapping: ``[T]`` int64 (int32 accepted) compressed-cache slots, -1 = skip.
        compress_ratio: group size, 1 or 2.
        fp8_scale: ``[1]`` float32, only for a ``float8_e4m3fn`` cache.
    """
    check_tensor("kv_cache", kv_cache, dtype=(torch.uint8, torch.bfloat16, torch.float8_e4m3fn))
    dev = kv_cache.device
    num_tokens = _check_common(latent, positions, cos_sin_cache, slot_mapping, compress_ratio, dev)
    if kv_cache.dtype == torch.uint8:
        _check_record_cache(kv_cache)
    else:
        _check_plain_cache(kv_cache, fp8_scale)
    if num_tokens == 0:
        return
    if kv_cache.dtype == torch.uint8:
        cfg = kernel_config("cache_writers.compressed_kv")
        compressed_kv_v4_record_kernel[(num_tokens,)](
            latent,
            latent.stride(0),
            positions,
            cos_sin_cache,
            cos_sin_cache.stride(0),
            kv_cache,
            kv_cache.stride(0),
            slot_mapping,
            kv_cache.shape[1],
            COMPRESS_RATIO=compress_ratio,
            **cfg.launch_options(),
        )
        return
    store_fp8 = kv_cache.dtype == torch.float8_e4m3fn
    cfg = kernel_config("cache_writers.plain_rows")
    compressed_kv_plain_row_kernel[(num_tokens,)](
        latent,
        latent.stride(0),
        positions,
        cos_sin_cache,
        cos_sin_cache.stride(0),
        kv_cache.view(torch.uint8) if store_fp8 else kv_cache.view(torch.int16),
        kv_cache.stride(0),
        kv_cache.stride(1),
        slot_mapping,
        kv_cache.shape[1],
        fp8_scale if store_fp8 else cos_sin_cache,  # unused without STORE_FP8
        COMPRESS_RATIO=compress_ratio,
        STORE_FP8=store_fp8,
        **cfg.launch_options(),
    )


__all__ = [
    "compressed_kv_plain_row_kernel",
    "compressed_kv_v4_record_kernel",
    "rope_quant_insert",
]
