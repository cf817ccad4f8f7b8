"""indexer-pack-seq: fp8 queries padded as bytes through vLLM's uint8 path."""

import pytest
import torch

from tools.tiers import import_or_skip

pytestmark = pytest.mark.vllm
import_or_skip("vllm")


def _fp8_rows(n: int, d: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    raw = torch.randint(0, 256, (n, 4, d), generator=g, dtype=torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x11  # no NaN codes: equality below compares values
    return raw.view(torch.float8_e4m3fn)


@pytest.mark.parametrize("lengths", [[6, 6, 1, 6], [1], [3, 0, 2]])
def test_fp8_pack_keeps_every_byte_and_pads_with_zero(lengths):
    from deepinfer_sm80.vllm_plugin.pack_seq import pack_seq_triton

    lens = torch.tensor(lengths, dtype=torch.int32)
    x = _fp8_rows(int(lens.sum()), 32)
    out = pack_seq_triton(x, lens)
    assert out.dtype == torch.float8_e4m3fn
    assert out.shape == (len(lengths), max(lengths), 4, 32)
    start = 0
    for b, n in enumerate(lengths):
        got = out[b, :n].view(torch.uint8)
        want = x[start : start + n].view(torch.uint8)
        assert torch.equal(got, want)
        assert not out[b, n:].view(torch.uint8).any(), "padding must be byte 0"
        start += n


def test_fp8_pack_matches_vllms_kernel_on_the_real_rows():
    """vLLM's own fp8 path (runs under the interpreter, not on sm80) agrees on real rows."""
    from vllm.v1.attention.ops.common import pack_seq_triton as vllm_pack

    from deepinfer_sm80.vllm_plugin.pack_seq import pack_seq_triton

    lens = torch.tensor([6, 2, 6], dtype=torch.int32)
    x = _fp8_rows(14, 16)
    ours, theirs = pack_seq_triton(x, lens), vllm_pack(x, lens)
    for b, n in enumerate(lens.tolist()):
        assert torch.equal(ours[b, :n].view(torch.uint8), theirs[b, :n].view(torch.uint8))


def test_other_dtypes_go_to_vllm_unchanged():
    from deepinfer_sm80.vllm_plugin.pack_seq import pack_seq_triton

    lens = torch.tensor([2, 1], dtype=torch.int32)
    x = torch.arange(3 * 5, dtype=torch.float32).reshape(3, 5)
    out = pack_seq_triton(x, lens)
    assert torch.equal(out[0], x[:2]) and torch.equal(out[1, 0], x[2])
    assert torch.isinf(out[1, 1]).all() and (out[1, 1] < 0).all()
