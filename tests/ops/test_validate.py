"""ops/_validate: the shared argument checks name the argument and the fix."""

import pytest
import torch

from deepinfer_sm80.ops._validate import check_paged_records


def _pages(num_pages: int, block_size: int, record: int, page_stride: int) -> torch.Tensor:
    flat = torch.zeros(num_pages * max(page_stride, block_size * record), dtype=torch.uint8)
    return flat.as_strided((num_pages, block_size, record), (page_stride, record, 1))


def test_padded_page_strides_pass():
    check_paged_records("kv_cache", _pages(3, 64, 584, 64 * 584), 584)
    check_paged_records("kv_cache", _pages(3, 64, 584, 64 * 584 + 512), 584)


def test_short_page_stride_is_refused_with_the_sizes():
    with pytest.raises(ValueError, match=r"kv_cache: page stride 37000 B is smaller than "):
        check_paged_records("kv_cache", _pages(3, 64, 584, 37000), 584)


def test_strided_bytes_are_refused():
    cache = torch.zeros(2, 16, 264, dtype=torch.uint8)[..., ::2]
    with pytest.raises(ValueError, match="k_cache: the byte dimension must be contiguous"):
        check_paged_records("k_cache", cache, 132)


def test_flat_pages_use_the_given_block_size():
    flat = torch.zeros(4, 64 * 584, dtype=torch.uint8)
    check_paged_records("k_cache", flat, 584, block_size=64)
    with pytest.raises(ValueError, match="block_size 65 x 584 B"):
        check_paged_records("k_cache", flat, 584, block_size=65)
