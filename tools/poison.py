"""Memory poisoning for tests: anything a kernel fails to write stays detectable.

Float outputs start as NaN and index outputs as -2 (a value no op ever writes, unlike
-1), so an element the kernel forgot fails the comparison with the reference.
"""

import torch

INDEX_POISON = -2


def nan_empty(*shape: int, dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def index_empty(*shape: int, dtype=torch.int32, device="cpu") -> torch.Tensor:
    return torch.full(shape, INDEX_POISON, dtype=dtype, device=device)


def paged_cache(
    num_blocks: int, block_size: int, device="cpu", fill: int = 0xFF, page_bytes: int | None = None
) -> torch.Tensor:
    """A V4 cache laid out as vLLM allocates it: ``[num_blocks, block_size, 584]`` uint8
    over pages ``page_bytes`` apart (default: vLLM's 576-aligned size).

    ``fill`` defaults to 0xFF: unwritten e4m3 bytes decode to NaN and unwritten scale
    bytes to +inf, so a gather that reads a slot nobody wrote produces NaN.
    """
    from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES
    from deepinfer_sm80.ops.kv_cache.layout import page_bytes as vllm_page_bytes

    stride = vllm_page_bytes(block_size) if page_bytes is None else page_bytes
    flat = torch.full((num_blocks * stride,), fill, dtype=torch.uint8, device=device)
    return flat.as_strided((num_blocks, block_size, RECORD_BYTES), (stride, RECORD_BYTES, 1))


def cache_bytes(k_cache: torch.Tensor) -> torch.Tensor:
    """Every byte of a paged cache, padding included, as ``[num_blocks, page_bytes]``."""
    return k_cache.as_strided((k_cache.shape[0], k_cache.stride(0)), (k_cache.stride(0), 1))


def move_cache(k_cache: torch.Tensor, device) -> torch.Tensor:
    """Copy a paged cache to ``device`` keeping its page stride (``.to()`` would compact a
    view with page padding into a different layout)."""
    flat = cache_bytes(k_cache).to(device)
    return flat.as_strided(k_cache.shape, k_cache.stride())
