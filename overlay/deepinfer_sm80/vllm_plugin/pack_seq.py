"""Padding the sparse indexer's fp8 decode queries without fp8e4nv.

When decode rows are uneven (a short prefill chunk among DSpark's K+1-row decodes), vLLM's
indexer packs the float8_e4m3fn index Q with ``pack_seq_triton``, whose Triton kernel then
types its pointers ``*fp8e4nv``: Triton refuses that below sm_89. Packing is a byte copy,
so this packs the same bytes as uint8 -- vLLM's own kernel, on its uint8 path, which
compiles for sm_80 -- and views the result back as fp8.

One difference, on purpose: padded fp8 slots hold byte 0 (+0.0) rather than vLLM's
``-inf`` cast to e4m3 (which e4m3fn cannot represent). The indexer masks padded slots by
context length, so they are never read as scores; zeros also cannot turn into NaN.
Every other dtype goes to vLLM's function unchanged.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.ops.common import pack_seq_triton as _vllm_pack_seq_triton

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2)


def pack_seq_triton(
    x: torch.Tensor,
    lengths: torch.Tensor,
    pad_value: float | int = -float("inf"),
    block_t: int = 64,
    block_d: int = 64,
) -> torch.Tensor:
    """vLLM's ``pack_seq_triton`` (same signature); fp8 inputs packed as bytes."""
    if x.dtype in FP8_DTYPES:
        packed = _vllm_pack_seq_triton(
            x.view(torch.uint8), lengths, pad_value=0, block_t=block_t, block_d=block_d
        )
        return packed.view(x.dtype)
    return _vllm_pack_seq_triton(x, lengths, pad_value, block_t, block_d)
