"""Python references for index combination and global Top-K slot mapping.

Plain loops over tokens, written from the rules in vLLM 0.33.0's docstrings and
kernels (``cache_utils.py``: ``combine_topk_swa_indices``,
``compute_global_topk_indices_and_lens``), so they are easy to read against them.
"""

import torch

TOPK_ALIGNMENT = 128  # FlashMLA sparse prefill needs topk % 128 == 0


def combined_width(topk: int, window_size: int) -> int:
    return -(-(topk + window_size) // TOPK_ALIGNMENT) * TOPK_ALIGNMENT


def combine_topk_swa_indices_ref(
    topk_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of gather-workspace indices per query token, -1 padded.

    Token ``i`` of request ``b`` sits at ``pos = seq_len - query_len + i``. Its row holds
    ``topk_len = min((pos + 1) // ratio, topk)`` Top-K entries ``b*M + idx`` (-1 where
    ``idx`` is not in ``[0, N)``), then the SWA rows ``b*M + N + (p - gather_start)`` for
    ``p`` in ``[swa_start, pos]``, then -1. Tokens no request covers get a -1 row and
    length 0.
    """
    num_tokens = topk_indices.shape[0]
    width = combined_width(topk, window_size)
    out = torch.full((num_tokens, width), -1, dtype=torch.int32)
    lens = torch.zeros(num_tokens, dtype=torch.int32)
    qsl = [int(v) - int(query_start_loc[0]) for v in query_start_loc.tolist()]
    tk = topk_indices.cpu()
    for b in range(len(qsl) - 1):
        seq_len, gather_len = int(seq_lens[b]), int(gather_lens[b])
        query_len = qsl[b + 1] - qsl[b]
        gather_start = seq_len - gather_len
        for t in range(qsl[b], qsl[b + 1]):
            pos = seq_len - query_len + (t - qsl[b])
            topk_len = max(min((pos + 1) // compress_ratio, topk), 0) if compress_ratio else 0
            idx = tk[t, :topk_len]
            out[t, :topk_len] = torch.where((idx >= 0) & (idx < N), b * M + idx, -1)
            swa_start = max(pos - window_size + 1, 0, gather_start)
            swa_len = max(pos - swa_start + 1, 0)
            first = b * M + N + swa_start - gather_start
            out[t, topk_len : topk_len + swa_len] = torch.arange(first, first + swa_len)
            lens[t] = topk_len + swa_len
    return out.to(topk_indices.device), lens.to(topk_indices.device)


def compute_global_topk_indices_and_lens_ref(
    topk_indices: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_valid_token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Local compressed positions -> paged slots; -1 kept; lens = count of entries >= 0
    (not a prefix length: holes are not counted), 0 for tokens marked invalid."""
    num_tokens = topk_indices.shape[0]
    req = token_to_req_indices[:num_tokens].long()
    idx = topk_indices.long()
    valid = idx >= 0
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    pages = block_table.long()[req[:, None], safe // block_size]
    slots = torch.where(valid, pages * block_size + safe % block_size, torch.full_like(idx, -1))
    lens = valid.sum(dim=1).to(torch.int32)
    lens = torch.where(is_valid_token[:num_tokens].bool(), lens, torch.zeros_like(lens))
    return slots.to(torch.int32), lens
