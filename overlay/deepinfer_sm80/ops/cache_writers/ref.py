"""PyTorch references for the indexer K writer and the compressed KV writer.

How the bytes match vLLM 0.33.0's kernels:

- Quantizer (``ue8m0_e4m3_quantize_ref``): the exponent is computed exactly,
  ``ceil(log2(amax / 448))`` from ``frexp`` of the fp32 amax. vLLM computes
  ``ceil(log2f(amax * fl(1/448)))`` in fp32; the two agree for every bf16 amax and for
  the 1e-4 floor, the only values the writers see (their inputs are bf16), which a test
  checks over all bf16 values. Values are ``x * 2**-e`` rounded by torch's e4m3fn
  conversion after clamping to +-448: round to nearest even, saturating, as the GPU's
  ``cvt.rn.satfinite.e4m3x2`` after vLLM's clamp. Non-finite inputs follow vLLM's GPU
  code: the group maximum ignores NaN, a NaN value is stored as +448 (its
  ``min.xorsign.abs`` clamp returns the non-NaN operand), an infinite amax gives scale
  byte 255 (scale 2**-inf = 0).
- bf16 rounding is torch's (round to nearest even), NaN stored as 0x7FFF.
- Norm and RoPE are plain fp32 torch operations in vLLM's order, without FMA. They
  equal the kernels under the interpreter whenever the RMSNorm sum of squares is exact
  (the one fp32 reduction, whose last bit depends on summation order; the reference
  sums in float64). On a GPU the kernels follow vLLM's compiled code instead
  (``rsqrt.approx``, FMA contraction), so there the oracle is vLLM's own kernel.
"""

import torch

from deepinfer_sm80.ops.cache_writers.layout import INDEX_HEAD_DIM, INDEX_ROPE_DIM
from deepinfer_sm80.ops.fp8.ref import E4M3_MAX, e4m3_encode_ref
from deepinfer_sm80.ops.kv_cache.layout import (
    DATA_BYTES,
    NOPE_DIM,
    NUM_SCALES,
    QUANT_BLOCK,
    SCALE_BYTES,
)
from deepinfer_sm80.ops.kv_cache.ref import AMAX_FLOOR, page_views

_BF16_NAN_BITS = 0x7FFF  # what cvt.rn.bf16.f32 writes for NaN
_ROPE_PAIRS = INDEX_ROPE_DIM // 2


def bf16_round_ref(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> nearest-even bf16 value, as fp32."""
    return x.float().to(torch.bfloat16).float()


def bf16_bits_ref(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 bit patterns (int16), nearest even; NaN -> 0x7FFF."""
    bits = x.float().to(torch.bfloat16).view(torch.int16)
    return torch.where(torch.isnan(x), torch.full_like(bits, _BF16_NAN_BITS), bits)


def ue8m0_exponent_ref(amax: torch.Tensor) -> torch.Tensor:
    """Exact ``ceil(log2(max(amax, 1e-4) / 448))`` (fp32), +inf for an infinite amax.

    With ``amax = m * 2**e``, ``m`` in [0.5, 1), and ``448 = 0.875 * 2**9``, the
    smallest ``k`` with ``448 * 2**k >= amax`` is ``e - 9``, plus 1 when ``m > 0.875``.
    """
    floor = torch.tensor(AMAX_FLOOR, dtype=torch.float32, device=amax.device)
    a = torch.where(torch.isnan(amax) | (amax < floor), floor, amax.float())
    mant, exp = torch.frexp(torch.where(torch.isinf(a), floor, a))
    k = (exp - 9 + (mant > 0.875).to(exp.dtype)).float()
    return torch.where(torch.isinf(a), torch.full_like(k, float("inf")), k)


def ue8m0_e4m3_quantize_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize groups along the last dim: fp32 ``[..., n]`` -> (e4m3 bytes, exponent).

    One UE8M0 exponent per group (``ue8m0_exponent_ref`` of the NaN-ignoring amax),
    values ``x * 2**-exponent`` as e4m3fn bytes, NaN stored as +448.
    """
    x = x.float()
    amax = torch.where(torch.isnan(x), torch.zeros_like(x), x.abs()).amax(dim=-1)
    exponent = ue8m0_exponent_ref(amax)
    scaled = x * torch.exp2(-exponent)[..., None]
    scaled = torch.where(torch.isnan(scaled), torch.full_like(scaled, E4M3_MAX), scaled)
    return e4m3_encode_ref(scaled), exponent


def scale_bytes_ref(exponent: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes: ``exponent + 127`` clamped to 0..255 (inf -> 255)."""
    return (exponent + 127).clamp(0, 255).to(torch.uint8)


def gptj_rope_ref(
    x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, compress_ratio: int
) -> torch.Tensor:
    """GPT-J RoPE on the last 64 dims of fp32 rows ``[N, D]`` (D even, >= 64), fp32 out.

    Pairs ``(2i, 2i+1)``; the rotation uses the cache row of the group's first position
    ``pos // ratio * ratio`` (32 cos then 32 sin). Earlier pairs go through the same
    formula with (cos, sin) = (1, 0), as vLLM computes them.
    """
    n, d = x.shape
    pairs = d // 2
    rows = (positions.long() // compress_ratio) * compress_ratio
    cs = cos_sin_cache[rows].float()
    cos = torch.ones(n, pairs, device=x.device)
    sin = torch.zeros(n, pairs, device=x.device)
    cos[:, pairs - _ROPE_PAIRS :] = cs[:, :_ROPE_PAIRS]
    sin[:, pairs - _ROPE_PAIRS :] = cs[:, _ROPE_PAIRS:]
    even, odd = x[:, 0::2], x[:, 1::2]
    out = torch.empty_like(x)
    out[:, 0::2] = even * cos - odd * sin
    out[:, 1::2] = odd * cos + even * sin
    return out


def _publishing(positions: torch.Tensor, slot_mapping: torch.Tensor, ratio: int) -> list[int]:
    """Tokens that write: a slot >= 0 and the last token of their group."""
    pos = positions[: slot_mapping.shape[0]].tolist()
    return [
        i for i, slot in enumerate(slot_mapping.tolist()) if slot >= 0 and (pos[i] + 1) % ratio == 0
    ]


# ------------------------------------------------------------------ indexer K cache


def indexer_k_rows_ref(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    compress_ratio: int,
) -> torch.Tensor:
    """The keys before quantization: bf16(RoPE(bf16(rmsnorm(k_pre) * w))), as fp32."""
    k = k_pre.float()
    mean_sq = ((k.double() ** 2).sum(dim=-1) / INDEX_HEAD_DIM).float()
    eps = torch.tensor(rms_norm_eps, dtype=torch.float32, device=k.device)
    inv_rms = 1.0 / torch.sqrt(mean_sq + eps)
    k = bf16_round_ref(k * inv_rms[:, None] * rms_norm_weight.float())
    return bf16_round_ref(gptj_rope_ref(k, positions, cos_sin_cache, compress_ratio))


def indexer_k_encode_ref(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 keys ``[N, 128]`` -> (e4m3 bytes ``[N, 128]``, fp32 scales ``2**e`` ``[N]``)."""
    values, exponent = ue8m0_e4m3_quantize_ref(keys)
    return values, torch.exp2(exponent)


def indexer_page_views(k_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A paged indexer cache as (values ``[B, bs, 128]``, scale bytes ``[B, bs, 4]``)."""
    num_blocks, block_size = k_cache.shape[:2]
    flat = k_cache.as_strided((num_blocks, k_cache.stride(0)), (k_cache.stride(0), 1))
    values = flat[:, : block_size * INDEX_HEAD_DIM].view(num_blocks, block_size, -1)
    end = block_size * (INDEX_HEAD_DIM + 4)
    scales = flat[:, block_size * INDEX_HEAD_DIM : end].view(num_blocks, block_size, 4)
    return values, scales


def indexer_k_store_ref(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
) -> None:
    """What ``indexer_k_norm_rope_store`` writes (FP8 cache), record by record."""
    n = kv_slot_mapping.shape[0]
    keys = indexer_k_rows_ref(
        k_pre[:n], positions[:n], cos_sin_cache, rms_norm_weight, rms_norm_eps, compress_ratio
    )
    values, scales = indexer_k_encode_ref(keys)
    scale_bytes = scales.view(torch.uint8).view(n, 4)
    page_values, page_scales = indexer_page_views(k_cache)
    block_size = k_cache.shape[1]
    for i in _publishing(positions, kv_slot_mapping, compress_ratio):
        slot = int(kv_slot_mapping[i])
        page_values[slot // block_size, slot % block_size] = values[i]
        page_scales[slot // block_size, slot % block_size] = scale_bytes[i]


# ------------------------------------------------------------------ compressed KV cache


def v4_records_ref(
    latent: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, compress_ratio: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 latents ``[N, 512]`` -> V4 records (data ``[N, 576]``, scales ``[N, 8]``)."""
    n = latent.shape[0]
    x = latent.float()
    values, exponent = ue8m0_e4m3_quantize_ref(x[:, :NOPE_DIM].reshape(n, NUM_SCALES, QUANT_BLOCK))
    rope = gptj_rope_ref(x[:, NOPE_DIM:], positions, cos_sin_cache, compress_ratio)
    data = torch.empty(n, DATA_BYTES, dtype=torch.uint8, device=latent.device)
    data[:, :NOPE_DIM] = values.reshape(n, NOPE_DIM)
    data[:, NOPE_DIM:] = bf16_bits_ref(rope).view(torch.uint8).reshape(n, 2 * INDEX_ROPE_DIM)
    scales = torch.zeros(n, SCALE_BYTES, dtype=torch.uint8, device=latent.device)
    scales[:, :NUM_SCALES] = scale_bytes_ref(exponent)
    return data, scales


def plain_rows_ref(
    latent: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    compress_ratio: int,
    fp8_scale: torch.Tensor | None,
) -> torch.Tensor:
    """Plain-row values: bf16 bits (int16) or, with ``fp8_scale``, e4m3 bytes (uint8)."""
    rows = gptj_rope_ref(latent.float(), positions, cos_sin_cache, compress_ratio)
    if fp8_scale is None:
        return bf16_bits_ref(rows)
    scaled = bf16_round_ref(rows) * (1.0 / fp8_scale.float().reshape(()))
    scaled = torch.where(torch.isnan(scaled), torch.full_like(scaled, E4M3_MAX), scaled)
    return e4m3_encode_ref(scaled)


def rope_quant_insert_ref(
    latent: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    compress_ratio: int,
    fp8_scale: torch.Tensor | None = None,
) -> None:
    """What ``rope_quant_insert`` writes, for the V4 record and the plain-row caches."""
    n = slot_mapping.shape[0]
    block_size = kv_cache.shape[1]
    writers = _publishing(positions, slot_mapping, compress_ratio)
    if kv_cache.dtype == torch.uint8:
        data, scales = v4_records_ref(latent[:n], positions[:n], cos_sin_cache, compress_ratio)
        page_data, page_scales = page_views(kv_cache, block_size)
        for i in writers:
            slot = int(slot_mapping[i])
            page_data[slot // block_size, slot % block_size] = data[i]
            page_scales[slot // block_size, slot % block_size] = scales[i]
        return
    is_fp8 = kv_cache.dtype == torch.float8_e4m3fn
    rows = plain_rows_ref(
        latent[:n], positions[:n], cos_sin_cache, compress_ratio, fp8_scale if is_fp8 else None
    )
    view = kv_cache.view(torch.uint8 if is_fp8 else torch.int16)
    for i in writers:
        slot = int(slot_mapping[i])
        view[slot // block_size, slot % block_size] = rows[i]
