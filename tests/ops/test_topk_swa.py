"""ops/topk_swa: index combination and global Top-K slots, bit-exact against ref.py."""

import pytest
import torch

from deepinfer_sm80.ops.topk_swa import (
    combine_topk_swa_indices,
    compute_global_topk_indices_and_lens,
)
from deepinfer_sm80.ops.topk_swa.ref import (
    combine_topk_swa_indices_ref,
    combined_width,
    compute_global_topk_indices_and_lens_ref,
)
from tools.poison import INDEX_POISON, index_empty

WINDOW = 128
TOPK = 512


def make_chunk(
    query_lens,
    contexts,
    *,
    replay_cap=None,
    base=0,
    extra_rows=0,
    seed=0,
    topk_width=TOPK,
    device="cpu",
):
    """A prefill chunk as vLLM builds it: query_start_loc global (offset by ``base``),
    seq_len = context + query, gather_len = query + min(context, window - 1) (optionally
    capped by bounded replay), M/N from the chunk's maxima. Top-K rows hold a mix of
    valid positions, -1 holes and out-of-pool (>= N) candidates."""
    g = torch.Generator().manual_seed(seed)
    seq = [q + c for q, c in zip(query_lens, contexts, strict=True)]
    gl = [q + min(c, WINDOW - 1) for q, c in zip(query_lens, contexts, strict=True)]
    if replay_cap is not None:
        gl = [min(x, replay_cap + q) for x, q in zip(gl, query_lens, strict=True)]
    qsl = [base]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    T = sum(query_lens) + extra_rows
    N = max(seq) + 1
    M = N + max(gl)
    topk = torch.randint(0, N + 40, (T, topk_width), generator=g, dtype=torch.int32)
    holes = torch.rand(T, topk_width, generator=g) < 0.1
    topk[holes] = -1
    t = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return topk.to(device), t(qsl), t(seq), t(gl), M, N


def _check_combine(chunk, ratio, topk, window=WINDOW, out=None):
    topk_idx, qsl, seq, gl, M, N = chunk
    got_i, got_l = combine_topk_swa_indices(
        topk_idx, qsl, seq, gl, window, ratio, topk, M, N, out=out
    )
    want_i, want_l = combine_topk_swa_indices_ref(topk_idx, qsl, seq, gl, window, ratio, topk, M, N)
    T = topk_idx.shape[0]
    assert got_i.shape[1] == combined_width(topk, window)
    bad = (got_i[:T] != want_i).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} index entries differ, first {bad[0].tolist()}"
    assert torch.equal(got_l[:T], want_l)
    assert not (got_i == INDEX_POISON).any() and not (got_l[:T] == INDEX_POISON).any()
    return got_i, got_l


@pytest.mark.parametrize("ratio,topk", [(0, 0), (1, TOPK), (2, TOPK)])
@pytest.mark.parametrize(
    "query_lens,contexts",
    [
        pytest.param([1], [0], id="first-token"),
        pytest.param([7], [0], id="odd-fresh"),
        pytest.param([3, 130, 1], [125, 0, 2000], id="three-requests"),
        # Tokens crossing the window edge: positions 126..129 of a request.
        pytest.param([4], [126], id="window-edge"),
        # (pos + 1) // ratio crosses topk=512: ratio 1 at pos 511, ratio 2 at 1023.
        pytest.param([6, 6], [508, 1020], id="topk-saturation"),
        pytest.param([129], [4000], id="long-context"),
    ],
)
def test_combine_matches_reference(device, ratio, topk, query_lens, contexts):
    _check_combine(make_chunk(query_lens, contexts, base=1000, device=device), ratio, topk)


def test_combine_bounded_replay(device):
    """gather_len capped below query + window - 1: the window starts at gather_start."""
    chunk = make_chunk([5, 40], [300, 90], replay_cap=20, device=device)
    _check_combine(chunk, 1, TOPK)


def test_combine_uncovered_rows_and_workspace(device):
    """Rows past the chunk's last query and workspace rows past T become -1, length 0;
    a poisoned workspace is fully rewritten."""
    chunk = make_chunk([3, 9], [10, 200], extra_rows=5, device=device)
    T = chunk[0].shape[0]
    ws_i = index_empty(T + 7, combined_width(TOPK, WINDOW), device=device)
    ws_l = index_empty(T + 7, device=device)
    got_i, _ = _check_combine(chunk, 2, TOPK, out=(ws_i, ws_l))
    assert got_i.data_ptr() == ws_i.data_ptr()
    assert (ws_i[12:] == -1).all() and (ws_l[12:T] == 0).all()


def test_combine_all_holes_and_all_out_of_pool(device):
    topk_idx, qsl, seq, gl, M, N = make_chunk([8], [600], device=device)
    for fill in (-1, N, N + 100):
        topk_idx.fill_(fill)
        got_i, got_l = _check_combine((topk_idx, qsl, seq, gl, M, N), 1, TOPK)
        # Holes stay inside the counted length: 512 Top-K (all -1) + 128 SWA.
        assert (got_l == TOPK + WINDOW).all() and (got_i[:, :TOPK] == -1).all()


def test_combine_dspark_widened_window(device):
    """DSpark draft layers widen the window to round_up(128 + K); K=5 -> 133 here
    (any width is accepted; vLLM's kernel needs a power-of-two window)."""
    _check_combine(make_chunk([5, 5], [300, 2], device=device), 0, 0, window=133)


def test_combine_empty(device):
    topk_idx = torch.empty(0, TOPK, dtype=torch.int32, device=device)
    qsl = torch.zeros(1, dtype=torch.int32, device=device)
    seq = gl = torch.empty(0, dtype=torch.int32, device=device)
    M = N = 0
    i, lens = combine_topk_swa_indices(topk_idx, qsl, seq, gl, WINDOW, 1, TOPK, M, N)
    assert i.shape == (0, 640) and lens.shape == (0,)


@pytest.mark.gpu
def test_combine_production_chunk(device):
    """A 16K-token prefill chunk of four requests at long context, ratio 1 and 2."""
    chunk = make_chunk([4096, 4096, 4095, 4097], [0, 60000, 130000, 7], device=device)
    for ratio in (1, 2):
        _check_combine(chunk, ratio, TOPK)


def test_combine_errors(device):
    topk_idx, qsl, seq, gl, M, N = make_chunk([3], [5], device=device)
    with pytest.raises(ValueError, match="query_start_loc must have"):
        combine_topk_swa_indices(topk_idx, qsl[:1], seq, gl, WINDOW, 1, TOPK, M, N)
    with pytest.raises(ValueError, match="topk: 600 exceeds"):
        combine_topk_swa_indices(topk_idx, qsl, seq, gl, WINDOW, 1, 600, M, N)
    with pytest.raises(ValueError, match="N: the SWA region start"):
        combine_topk_swa_indices(topk_idx, qsl, seq, gl, WINDOW, 1, TOPK, 3, 4)
    with pytest.raises(ValueError, match=r"topk_indices: expected dtype torch\.int32"):
        combine_topk_swa_indices(topk_idx.long(), qsl, seq, gl, WINDOW, 1, TOPK, M, N)
    bad_out = (index_empty(3, 512, device=device), index_empty(3, device=device))
    with pytest.raises(ValueError, match="out\\[0\\]: expected contiguous rows of width"):
        combine_topk_swa_indices(topk_idx, qsl, seq, gl, WINDOW, 1, TOPK, M, N, out=bad_out)


# ------------------------------------------------------------------ global Top-K


def _global_case(num_tokens, width, block_size, seed, device):
    g = torch.Generator().manual_seed(seed)
    max_blocks = 50
    table = torch.randint(0, 10_000, (4, max_blocks), generator=g, dtype=torch.int32)
    idx = torch.randint(
        -1, max_blocks * block_size, (num_tokens, width), generator=g, dtype=torch.int32
    )
    req = torch.randint(0, 4, (num_tokens,), generator=g, dtype=torch.int32)
    valid = torch.rand(num_tokens, generator=g) > 0.2
    return [t.to(device) for t in (idx, req, table)] + [block_size, valid.to(device)]


@pytest.mark.parametrize("num_tokens,width", [(1, 512), (37, 512), (5, 100), (3, 1)])
@pytest.mark.parametrize("block_size", [32, 64])
def test_global_topk_matches_reference(device, num_tokens, width, block_size):
    args = _global_case(num_tokens, width, block_size, num_tokens + width, device)
    got = compute_global_topk_indices_and_lens(*args)
    want = compute_global_topk_indices_and_lens_ref(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_global_topk_all_minus_one_and_invalid(device):
    idx, req, table, bs, valid = _global_case(6, 512, 64, 1, device)
    idx.fill_(-1)
    slots, lens = compute_global_topk_indices_and_lens(idx, req, table, bs, valid)
    assert (slots == -1).all() and (lens == 0).all()
    idx2, *_ = _global_case(6, 512, 64, 2, device)
    idx2 = idx2.clamp_min(0)
    slots, lens = compute_global_topk_indices_and_lens(
        idx2, req, table, bs, torch.zeros_like(valid)
    )
    assert (lens == 0).all() and (slots >= 0).all()


def test_global_topk_empty(device):
    idx, req, table, bs, valid = _global_case(0, 512, 64, 1, device)
    slots, lens = compute_global_topk_indices_and_lens(idx, req, table, bs, valid)
    assert slots.shape == (0, 512) and lens.shape == (0,)


def test_global_topk_errors(device):
    idx, req, table, bs, valid = _global_case(4, 512, 64, 1, device)
    with pytest.raises(ValueError, match="token_to_req_indices and is_valid_token need >= 4"):
        compute_global_topk_indices_and_lens(idx, req[:2], table, bs, valid)
    with pytest.raises(ValueError, match="block_size: expected an int >= 1"):
        compute_global_topk_indices_and_lens(idx, req, table, 0, valid)
