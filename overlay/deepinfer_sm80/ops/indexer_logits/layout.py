"""The DeepSeek-V4.1 indexer K cache, FP8 path, as vLLM 0.33.0 writes it on CUDA.

Writer: ``_indexer_k_norm_rope_quant_store_kernel`` in
``vllm/models/deepseek_v41/common/ops/indexer_k_store.py`` (not ``SHUFFLE``: that tiled
layout is ROCm's; not ``USE_FP4``: MXFP4 needs sm_100; not ``MX_SCALE``: sm_100 only).
One key of ``D = 128`` values per compressed position, one power-of-two fp32 scale each.
A page of ``block_size`` positions is laid out as

    [block_size x D]  e4m3fn bytes, position-major (position p at byte p * D)
    [block_size x 4]  fp32 scales (position p at byte block_size * D + 4 * p)
    padding up to k_cache.stride(0)

vLLM allocates it as ``[num_blocks, block_size, D + 4]`` uint8 (the middle and last
dimensions only count bytes: a position's values and scale are *not* adjacent), and the
indexer hands DeepGEMM the view ``[num_blocks, block_size, 1, D + 4]``. The page stride
``stride(0)`` can exceed ``block_size * (D + 4)``: the indexer page sits inside a larger
physical block shared with the MLA latent pages.

Scale rule (writer): ``exp = ceil(log2(max(amax, 1e-4) / 448))``; values are
``clamp(x * 2**-exp, +-448)`` rounded to e4m3; the stored scale is ``2**exp``.

Prefill reads a gathered copy instead (``ops.cp_gather_indexer_k_quant_cache``, a CUDA
op with sm_80/sm_86 code): ``k [N, D]`` e4m3fn and ``k_scale [N]`` fp32.
"""

import torch

HEAD_DIM = 128
SCALE_BYTES = 4
AMAX_FLOOR = 1e-4
E4M3_MAX = 448.0


def bytes_per_position(head_dim: int = HEAD_DIM) -> int:
    """Bytes one position takes in a page: its values plus its fp32 scale."""
    return head_dim + SCALE_BYTES


def page_views(kv_cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values ``[num_blocks, block_size, D]`` uint8, scales ``[num_blocks, block_size]``
    fp32) views of a paged cache given as ``[nb, bs, D + 4]`` or ``[nb, bs, 1, D + 4]``."""
    head_dim = kv_cache.shape[-1] - SCALE_BYTES
    num_blocks, stride = kv_cache.shape[0], kv_cache.stride(0)
    flat = kv_cache.as_strided((num_blocks, stride), (stride, 1))
    values = flat[:, : block_size * head_dim].view(num_blocks, block_size, head_dim)
    scale_bytes = flat[:, block_size * head_dim : block_size * (head_dim + SCALE_BYTES)]
    # vLLM's page strides are multiples of 512 or 576, so the fp32 view is aligned.
    return values, scale_bytes.view(torch.float32)


def allocate_cache(
    num_blocks: int,
    block_size: int,
    head_dim: int = HEAD_DIM,
    page_bytes: int | None = None,
    fill: int = 0,
    device="cpu",
) -> torch.Tensor:
    """An indexer cache ``[num_blocks, block_size, D + 4]`` uint8 with pages
    ``page_bytes`` apart (default: unpadded), every byte ``fill``."""
    width = bytes_per_position(head_dim)
    stride = block_size * width if page_bytes is None else page_bytes
    if stride < block_size * width or stride % 4:
        raise ValueError(f"page_bytes: {stride} is below {block_size * width} or not 4-aligned")
    flat = torch.full((num_blocks * stride,), fill, dtype=torch.uint8, device=device)
    return flat.as_strided((num_blocks, block_size, width), (stride, width, 1))
