"""ops/kv_cache: the 584-byte V4 record writer and gather, bit-exact against ref.py."""

import pytest
import torch

from deepinfer_sm80.ops.kv_cache import dequantize_and_gather_k_cache, quantize_and_insert_k_cache
from deepinfer_sm80.ops.kv_cache.layout import NOPE_DIM, RECORD_BYTES, page_bytes
from deepinfer_sm80.ops.kv_cache.ref import (
    decode_records_ref,
    encode_records_ref,
    gather_ref,
    insert_ref,
    page_views,
)
from tools.poison import cache_bytes, move_cache, nan_empty, paged_cache


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _peaked_k(n: int, seed: int, device) -> torch.Tensor:
    """bf16 K rows with realistic outliers and a wide dynamic range across rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 512, generator=g)
    x *= torch.logspace(-6, 6, n)[:, None] if n > 1 else 1.0
    spikes = torch.rand(n, 512, generator=g) < 0.01
    x = torch.where(spikes, x * 50, x)
    return x.to(torch.bfloat16).to(device)


def _boundary_k(device) -> torch.Tensor:
    """Rows whose group amax sits exactly on, just above and just below 448 * 2**j,
    plus all-zero and sub-floor groups (the 1e-4 amax floor decides their scale)."""
    rows = []
    for j in (-20, -3, 0, 1, 7, 30):
        for amax in (448.0 * 2.0**j, 449.75 * 2.0**j, 446.0 * 2.0**j):
            r = torch.linspace(-1, 1, 512) * amax
            rows.append(r)
    rows.append(torch.zeros(512))
    rows.append(torch.full((512,), 3e-5))
    rows.append(torch.full((512,), -1e-38))
    return torch.stack(rows).to(torch.bfloat16).to(device)


# ------------------------------------------------------------------ insert


@pytest.mark.parametrize("block_size", [32, 64, 256])
@pytest.mark.parametrize("num_tokens", [1, 37, 129])
def test_insert_bytes_equal_reference_encoder(device, block_size, num_tokens):
    num_blocks = -(-num_tokens // block_size) + 2
    k = torch.cat([_boundary_k(device), _peaked_k(num_tokens, 3, device)])[:num_tokens]
    # DP padding: k may have more rows than slot_mapping; those must not be written.
    k = torch.cat([k, torch.full((3, 512), 7.0, dtype=torch.bfloat16, device=device)])
    g = torch.Generator().manual_seed(num_tokens)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens].to(device)
    slots[num_tokens // 2] = -1
    got = paged_cache(num_blocks, block_size, device=device)
    want = paged_cache(num_blocks, block_size, device=device)
    quantize_and_insert_k_cache(k, got, slots, block_size)
    insert_ref(k, want, slots.cpu(), block_size) if device.type == "cpu" else insert_ref(
        k, want, slots, block_size
    )
    diff = (cache_bytes(got) != cache_bytes(want)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at page/byte {diff[0].tolist()}"


def test_insert_boundary_scales(device):
    """amax exactly 448 * 2**j keeps exponent j; the next bf16 up takes j + 1."""
    k = _boundary_k(device)
    data, scales = encode_records_ref(k.cpu())
    assert scales[0, 0].item() == 127 - 20  # 448 * 2**-20 -> exponent -20
    assert scales[1, 0].item() == 127 - 19  # 449.75 * 2**-20 -> -19
    assert scales[2, 0].item() == 127 - 20  # below the boundary -> -20
    assert scales[-3, 0].item() == 127 - 22  # zeros: amax floor 1e-4 -> -22
    cache = paged_cache(1, 64, device=device)
    slots = torch.arange(k.shape[0], device=device)
    quantize_and_insert_k_cache(k, cache, slots, 64)
    d, s = page_views(cache, 64)
    assert torch.equal(s[0, : k.shape[0]].cpu(), scales)
    assert torch.equal(d[0, : k.shape[0]].cpu(), data)


def test_insert_roundtrip_error_bounded(device):
    """Decoded records are within half an e4m3 step of the input (the format's bound)."""
    k = _peaked_k(64, 5, device)
    cache = paged_cache(1, 64, device=device)
    quantize_and_insert_k_cache(k, cache, torch.arange(64, device=device), 64)
    d, s = page_views(cache, 64)
    back = decode_records_ref(d[0].cpu(), s[0].cpu()).float()
    x = k.cpu().float()
    assert torch.equal(back[:, NOPE_DIM:], x[:, NOPE_DIM:])
    scale = torch.exp2(s[0, :, :7].cpu().float() - 127).repeat_interleave(64, dim=1)
    # e4m3 has 3 mantissa bits: relative half-step 2**-4 of the value, or of the
    # smallest normal (2**-6 x scale) for subnormals.
    tol = torch.maximum(x[:, :NOPE_DIM].abs() * 2**-4, scale * 2**-10) * 1.0001
    assert ((back[:, :NOPE_DIM] - x[:, :NOPE_DIM]).abs() <= tol).all()


def test_insert_empty_and_all_skipped(device):
    cache = paged_cache(2, 64, device=device)
    before = cache_bytes(cache).clone()
    k = _peaked_k(4, 0, device)
    quantize_and_insert_k_cache(k, cache, torch.empty(0, dtype=torch.int64, device=device), 64)
    quantize_and_insert_k_cache(k, cache, torch.full((4,), -1, device=device), 64)
    assert torch.equal(cache_bytes(cache), before)


# ------------------------------------------------------------------ gather


def _filled_cache(
    num_blocks: int, block_size: int, device, seed: int, pad: int = 0, min_scale: int = 10
):
    """A cache whose every record holds random valid bytes: e4m3 without the NaN codes,
    scales 10..254, finite bf16 RoPE.

    Scale bytes below 10 make fp32/bf16 denormal products, which Triton's CPU
    interpreter rounds to bf16 differently from torch (an interpreter artefact, not
    kernel maths; vLLM's encoder never writes bytes below 105). The comparison with
    vLLM's own gather, which runs through the same interpreter, uses 1..254.
    """
    stride = page_bytes(block_size) + pad
    cache = paged_cache(num_blocks, block_size, page_bytes=stride, device="cpu")
    g = torch.Generator().manual_seed(seed)
    data, scales = page_views(cache, block_size)
    nope = torch.randint(0, 0x7E, data[..., :NOPE_DIM].shape, generator=g, dtype=torch.uint8)
    sign = torch.randint(0, 2, nope.shape, generator=g, dtype=torch.uint8) << 7
    data[..., :NOPE_DIM] = nope | sign
    rope = torch.randn(*data.shape[:2], 64, generator=g).to(torch.bfloat16)
    data[..., NOPE_DIM:] = rope.view(torch.uint8)
    scales[..., :7] = torch.randint(
        min_scale, 255, scales[..., :7].shape, generator=g, dtype=torch.uint8
    )
    return move_cache(cache, device)


def _run_gather(
    device,
    seq_lens,
    gather_lens,
    block_size,
    offset,
    rows,
    ratio=1,
    pad=0,
    max_gather_len=None,
    out_view=False,
):
    comp_lens = [s // ratio for s in seq_lens]
    comp_bs = block_size // ratio
    pages_per_req = [max(1, -(-s // comp_bs)) for s in comp_lens]
    num_blocks = sum(pages_per_req) + 3
    cache = _filled_cache(num_blocks, comp_bs, device, seed=sum(seq_lens) + offset, pad=pad)
    g = torch.Generator().manual_seed(len(seq_lens))
    perm = torch.randperm(num_blocks, generator=g)
    table = torch.zeros(len(seq_lens), max(pages_per_req) + 1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages_per_req):
        table[b, :n] = perm[start : start + n].int()
        start += n
    table = table.to(device)
    sl = torch.tensor(comp_lens, dtype=torch.int32, device=device)
    gl = (
        None if gather_lens is None else torch.tensor(gather_lens, dtype=torch.int32, device=device)
    )
    if out_view:
        # A view into a wider workspace: rows 1024 elements apart, batch stride odd.
        ws = nan_empty(len(seq_lens) * rows * 2 + 1, 1024, device=device)
        out = ws[1:].view(len(seq_lens), rows * 2, 1024)[:, ::2, 256:768]
        want = ws.clone()[1:].view(len(seq_lens), rows * 2, 1024)[:, ::2, 256:768]
    else:
        out = nan_empty(len(seq_lens), rows, 512, device=device)
        want = out.clone()
    dequantize_and_gather_k_cache(
        out, cache, sl, gl, table, comp_bs, offset, max_gather_len=max_gather_len
    )
    gather_ref(want, cache, sl, gl, table, comp_bs, offset)
    mismatch = (_bits(out) != _bits(want)) & ~(torch.isnan(out) & torch.isnan(want))
    assert not mismatch.any(), (
        f"{int(mismatch.sum())} elements differ, first {mismatch.nonzero()[0].tolist()}"
    )
    # Everything the gather must write was written (no NaN left), nothing else was.
    for b in range(len(seq_lens)):
        n = comp_lens[b] if gl is None else int(gather_lens[b])
        assert not torch.isnan(out[b, offset : offset + n]).any()
        assert torch.isnan(out[b, :offset]).all() and torch.isnan(out[b, offset + n :]).all()


@pytest.mark.parametrize("seq_len", [0, 1, 2, 127, 128, 129, 4095])
@pytest.mark.parametrize("block_size", [64, 256])
def test_gather_lengths(device, seq_len, block_size):
    _run_gather(device, [seq_len], None, block_size, 0, rows=max(seq_len, 1))


@pytest.mark.parametrize("ratio", [1, 2])
def test_gather_compressed_cache(device, ratio):
    """Compressed caches pass seq_len // ratio and block_size // ratio."""
    _run_gather(device, [1001, 64, 3], None, 128, 0, rows=1001 // ratio + 1, ratio=ratio)


def test_gather_swa_tail_with_offset_and_gather_lens(device):
    """The prefill SWA gather: last gather_len positions land at rows [N, N + gl)."""
    seq, gl = [300, 5, 129, 1000], [140, 5, 1, 0]
    _run_gather(device, seq, gl, 64, offset=77, rows=77 + 141)


def test_gather_max_gather_len_and_padded_pages(device):
    _run_gather(device, [513, 31], [513, 31], 32, 0, rows=520, pad=576 * 3, max_gather_len=16)


def test_gather_writes_through_strided_view(device):
    _run_gather(device, [200, 77], [150, 77], 64, 9, rows=170, out_view=True)


@pytest.mark.gpu
@pytest.mark.parametrize("seq_len", [16384, 49152])
def test_gather_long_context(device, seq_len):
    _run_gather(device, [seq_len, 1234], [seq_len, 1000], 64, 0, rows=seq_len)


@pytest.mark.gpu
def test_gather_long_compressed_many_requests(device):
    _run_gather(device, [65536, 40000, 17, 0], None, 128, 3, rows=65536 // 2 + 3, ratio=2)


def test_gather_empty_batch_is_noop(device):
    cache = paged_cache(1, 64, device=device)
    out = nan_empty(0, 4, 512, device=device)
    e = torch.empty(0, dtype=torch.int32, device=device)
    dequantize_and_gather_k_cache(out, cache, e, None, e.view(0, 1), 64, 0)


# ------------------------------------------------------------------ errors


def test_errors_name_the_argument(device):
    cache = paged_cache(2, 64, device=device)
    out = nan_empty(1, 8, 512, device=device)
    sl = torch.tensor([4], dtype=torch.int32, device=device)
    bt = torch.zeros(1, 2, dtype=torch.int32, device=device)
    cases = [
        (dict(out=out.float()), "out: expected dtype torch.bfloat16"),
        (dict(seq_lens=sl.long()), "seq_lens: expected dtype torch.int32"),
        (dict(block_table=bt[0]), "block_table: expected 2 dimensions"),
        (dict(block_size=32), "block_size: 32 does not match"),
        (dict(offset=9), "offset: 9 is past"),
        (dict(use_fnuz=True), "use_fnuz"),
        (
            dict(gather_lens=torch.tensor([1, 2], dtype=torch.int32, device=device)),
            "gather_lens: expected 1",
        ),
        (dict(k_cache=torch.zeros(2, 64, 528, dtype=torch.uint8, device=device)), "SM100-only"),
    ]
    base = dict(
        out=out,
        k_cache=cache,
        seq_lens=sl,
        gather_lens=None,
        block_table=bt,
        block_size=64,
        offset=0,
    )
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            dequantize_and_gather_k_cache(**{**base, **change})
    k = _peaked_k(2, 0, device)
    slots = torch.tensor([0, 1], device=device)
    with pytest.raises(ValueError, match="k: has 2 rows but slot_mapping maps 3"):
        quantize_and_insert_k_cache(k, cache, torch.arange(3, device=device), 64)
    with pytest.raises(ValueError, match="bytes_per_token"):
        quantize_and_insert_k_cache(k, cache, slots, 64, bytes_per_token=528)
    with pytest.raises(ValueError, match=r"k: expected dtype torch\.bfloat16"):
        quantize_and_insert_k_cache(k.float(), cache, slots, 64)
    assert RECORD_BYTES == 584


def gather_case(seq_lens, gather_lens, block_size, offset, device):
    """A filled V4 cache, a shuffled block table and the lengths, as the prefill's two
    gathers get them (compressed: ``gather_lens=None``; SWA: the tail lengths and the
    workspace offset ``N``)."""
    pages = [max(1, -(-s // block_size)) for s in seq_lens]
    cache = _filled_cache(sum(pages) + 1, block_size, device, seed=7, min_scale=1)
    table = torch.zeros(len(seq_lens), max(pages), dtype=torch.int32)
    perm = torch.randperm(sum(pages) + 1, generator=torch.Generator().manual_seed(1)).int()
    start = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[start : start + n]
        start += n
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    gl = (
        None if gather_lens is None else torch.tensor(gather_lens, dtype=torch.int32, device=device)
    )
    rows = offset + max(seq_lens)
    return cache, sl, gl, table.to(device), rows
