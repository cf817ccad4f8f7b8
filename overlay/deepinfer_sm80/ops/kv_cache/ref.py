"""PyTorch references for the V4 KV record: encoder, decoder and gather.

The encoder follows vLLM 0.33.0's rule for UE8M0 scales,
``exp = ceil(log2(max(amax, 1e-4) / 448))``, with torch's own e4m3 conversion of the
clamped, scaled values. It is the byte oracle for our writer: vLLM's writer run under
the CPU interpreter rounds fp8 differently from the GPU, so it cannot be one.
"""

import torch

from deepinfer_sm80.ops.fp8.ref import e4m3_decode_ref, e4m3_encode_ref
from deepinfer_sm80.ops.kv_cache.layout import (
    DATA_BYTES,
    NOPE_DIM,
    NUM_SCALES,
    QUANT_BLOCK,
    ROPE_DIM,
    SCALE_BYTES,
)

AMAX_FLOOR = 1e-4


def encode_records_ref(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 ``[N, 512]`` -> (data bytes ``[N, 576]``, scale bytes ``[N, 8]``), uint8."""
    n = k.shape[0]
    nope = k[:, :NOPE_DIM].float().view(n, NUM_SCALES, QUANT_BLOCK)
    amax = nope.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    exponent = torch.ceil(torch.log2(amax / 448.0))
    scaled = nope * torch.exp2(-exponent)[..., None]
    data = torch.empty(n, DATA_BYTES, dtype=torch.uint8, device=k.device)
    data[:, :NOPE_DIM] = e4m3_encode_ref(scaled).view(n, NOPE_DIM)
    rope = k[:, NOPE_DIM:].contiguous().view(torch.uint8).view(n, 2 * ROPE_DIM)
    data[:, NOPE_DIM:] = rope
    scales = torch.zeros(n, SCALE_BYTES, dtype=torch.uint8, device=k.device)
    scales[:, :NUM_SCALES] = (exponent + 127).clamp(0, 255).to(torch.uint8)
    return data, scales


def decode_records_ref(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(data ``[N, 576]``, scales ``[N, 8]``) uint8 -> bf16 ``[N, 512]``.

    NoPE = e4m3 x 2**(s-127) per 64-dim group (exact in fp32, then rounded to bf16);
    RoPE = the stored bf16 values.
    """
    n = data.shape[0]
    vals = e4m3_decode_ref(data[:, :NOPE_DIM]).view(n, NUM_SCALES, QUANT_BLOCK)
    exps = scales[:, :NUM_SCALES].to(torch.float64) - 127.0
    nope = (vals.double() * torch.exp2(exps)[..., None]).float().view(n, NOPE_DIM)
    rope = data[:, NOPE_DIM:].contiguous().view(torch.bfloat16).view(n, ROPE_DIM)
    return torch.cat([nope.to(torch.bfloat16), rope], dim=1)


def page_views(k_cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a paged cache as (data ``[B, bs, 576]``, scales ``[B, bs, 8]``)."""
    flat = k_cache.as_strided((k_cache.shape[0], k_cache.stride(0)), (k_cache.stride(0), 1))
    data = flat[:, : block_size * DATA_BYTES].view(-1, block_size, DATA_BYTES)
    scale_end = block_size * (DATA_BYTES + SCALE_BYTES)
    scales = flat[:, block_size * DATA_BYTES : scale_end].view(-1, block_size, SCALE_BYTES)
    return data, scales


def insert_ref(
    k: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor, block_size: int
) -> None:
    """Write ``k[i]`` into slot ``slot_mapping[i]`` (-1 = skip) of a paged cache."""
    data, scales = page_views(k_cache, block_size)
    rec_data, rec_scales = encode_records_ref(k[: slot_mapping.shape[0]])
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        data[slot // block_size, slot % block_size] = rec_data[i]
        scales[slot // block_size, slot % block_size] = rec_scales[i]


def gather_ref(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
) -> None:
    """``out[b, offset + i]`` = decoded position ``seq_len - gather_len + i``."""
    data, scales = page_views(k_cache, block_size)
    for b, seq_len in enumerate(seq_lens.tolist()):
        gather_len = seq_len if gather_lens is None else int(gather_lens[b])
        if gather_len <= 0:
            continue
        pos = torch.arange(seq_len - gather_len, seq_len, device=k_cache.device)
        pages = block_table[b, pos // block_size].long()
        rows = pos % block_size
        out[b, offset : offset + gather_len] = decode_records_ref(
            data[pages, rows], scales[pages, rows]
        )
