"""Drop-in proof: our kernels equal vLLM 0.33.0's own kernels bit for bit.

vLLM's Triton kernels run on CPU under the interpreter when ``CUDA_VISIBLE_DEVICES``
is set and empty (conftest). Its gather dispatcher picks the CuteDSL kernel whenever
``cutlass`` imports, so the oracle is the ``_triton`` variant it falls back to. vLLM's
fp8 *writer* rounds differently under the interpreter, so it is not compared here; the
writer's oracle is the PyTorch encoder (test_kv_cache).
"""

import os

import pytest
import torch

from deepinfer_sm80.ops.kv_cache import dequantize_and_gather_k_cache
from deepinfer_sm80.ops.topk_swa import (
    combine_topk_swa_indices,
    compute_global_topk_indices_and_lens,
)
from tools.poison import nan_empty

from .test_kv_cache import _filled_cache, gather_case
from .test_topk_swa import TOPK, WINDOW, _global_case, make_chunk

pytestmark = pytest.mark.vllm

if os.environ.get("DEEPINFER_REQUIRE_VLLM") == "1":
    import vllm.models.deepseek_v41.common.ops.cache_utils as vllm_cache_utils
else:
    vllm_cache_utils = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")


def test_vllm_version_is_the_pinned_one():
    import vllm

    assert vllm.__version__.startswith("0.33.0"), vllm.__version__


@pytest.mark.parametrize(
    "seq_lens,gather_lens,block_size,offset",
    [
        ([1, 2, 127, 128, 129], None, 64, 0),
        ([300, 5, 129, 1000], [140, 5, 1, 0], 64, 77),
        ([2049], None, 128, 3),
    ],
)
def test_gather_equals_vllm_triton_gather(device, seq_lens, gather_lens, block_size, offset):
    cache, sl, gl, table, rows = gather_case(seq_lens, gather_lens, block_size, offset, device)
    ours = nan_empty(len(seq_lens), rows, 512, device=device)
    theirs = nan_empty(len(seq_lens), rows, 512, device=device)
    dequantize_and_gather_k_cache(ours, cache, sl, gl, table, block_size, offset)
    vllm_cache_utils.dequantize_and_gather_k_cache_triton(
        theirs, cache, sl, gl, table, block_size, offset
    )
    same = (ours.view(torch.int16) == theirs.view(torch.int16)) | (ours.isnan() & theirs.isnan())
    assert same.all(), (
        f"{int((~same).sum())} elements differ, first {(~same).nonzero()[0].tolist()}"
    )


@pytest.mark.parametrize("ratio,topk", [(0, 0), (1, TOPK), (2, TOPK)])
def test_combine_equals_vllm(ratio, topk):
    topk_idx, qsl, seq, gl, M, N = make_chunk([3, 130, 6, 1], [125, 0, 1020, 2000], base=17)
    ours = combine_topk_swa_indices(topk_idx, qsl, seq, gl, WINDOW, ratio, topk, M, N)
    theirs = vllm_cache_utils.combine_topk_swa_indices(
        topk_idx, qsl, seq, gl, WINDOW, ratio, topk, M, N
    )
    assert torch.equal(ours[0], theirs[0])
    assert torch.equal(ours[1], theirs[1])


def test_global_topk_equals_vllm():
    args = _global_case(33, 512, 64, 5, "cpu")
    ours = compute_global_topk_indices_and_lens(*args)
    theirs = vllm_cache_utils.compute_global_topk_indices_and_lens(*args)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


def test_sparse_mla_reference_decodes_records_like_vllm():
    """The sparse-MLA reference's record decode equals vLLM's own gather of the same
    slots (so the attention reference reads the cache exactly as vLLM does)."""
    from deepinfer_sm80.ops.sparse_mla.ref import decode_rows

    # Scale bytes >= 10: below that the products are denormal and the CPU interpreter
    # (running vLLM's kernel) rounds them to bf16 unlike torch (see _filled_cache).
    cache = _filled_cache(5, 64, "cpu", seed=3, min_scale=10)
    slots = torch.tensor([0, 63, 64, 200, 319, 5, 130], dtype=torch.int32)
    ours = decode_rows(cache, slots.long())
    # vLLM gathers positions [0, n) of one request; a block table that maps position i
    # to slot[i]'s page does the same selection when each slot sits at its own offset.
    theirs = nan_empty(1, 64 * 5, 512)
    table = torch.arange(5, dtype=torch.int32)[None, :]
    vllm_cache_utils.dequantize_and_gather_k_cache_triton(
        theirs, cache, torch.tensor([320], dtype=torch.int32), None, table, 64, 0
    )
    picked = theirs[0, slots.long()]
    same = (ours.view(torch.int16) == picked.view(torch.int16)) | (ours.isnan() & picked.isnan())
    assert same.all()
