"""PyTorch references for sparse MLA (DeepSeek-V4.1, 512-dim latent, one KV head).

Both decode and prefill compute, per query token ``t`` and head ``h``, over the rows the
index lists select (entries < 0 or past the cache are skipped, entries past the token's
length are ignored):

    s_j = scale * <q[t, h], k_j>          (k_j: the 512-dim row; V = K, all 512 dims)
    out = sum_j exp(s_j) k_j / (sum_j exp(s_j) + exp(sink[h]))      (sink optional)
    lse = log(sum_j exp(s_j))             (natural log; the sink does not enter it)

A token with no valid row gets out = 0 and lse = -inf. Records are decoded exactly as
vLLM 0.33.0 decodes the 584-byte V4 record (``ops/kv_cache/ref.py``; checked against
vLLM's own gather in the tests).

``precision="fp64"`` is the reference: fp64 maths on the decoded rows, fp64 results.
``"bf16"`` is "PyTorch doing the same attention in bf16" (bf16 matmuls, bf16 softmax),
fp32 results: the measure of what bf16 costs in the kernels' error budget
(``tools/compare.py``).
"""

import torch

from deepinfer_sm80.ops.kv_cache.ref import decode_records_ref, page_views


def decode_rows(k_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """bf16 ``[n, 512]`` rows of a paged 584-byte cache at global ``slots`` (all valid)."""
    block_size = k_cache.shape[1]
    data, scales = page_views(k_cache, block_size)
    pages, rows = slots // block_size, slots % block_size
    return decode_records_ref(data[pages, rows], scales[pages, rows])


def _selected(indices: torch.Tensor, length: int, num_rows: int) -> torch.Tensor:
    idx = indices[: max(0, min(length, indices.shape[0]))].long()
    return idx[(idx >= 0) & (idx < num_rows)]


PRECISIONS = ("fp64", "bf16")


def _dtype(precision: str) -> torch.dtype:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(PRECISIONS)}")
    return torch.float64 if precision == "fp64" else torch.float32


def _attend(q: torch.Tensor, k: torch.Tensor, scale: float, sink, precision: str):
    """q ``[H, 512]``, k ``[n, 512]`` -> (out ``[H, 512]``, lse ``[H]``), fp64 for the
    reference, fp32 for the bf16 model."""
    H = q.shape[0]
    dtype = _dtype(precision)
    if k.shape[0] == 0:
        return torch.zeros(H, 512, dtype=dtype), torch.full((H,), float("-inf"), dtype=dtype)
    if precision == "fp64":
        s = (q.double() @ k.double().T) * scale
        m = s.amax(dim=1, keepdim=True)
        if sink is not None:
            m = torch.maximum(m, sink.double()[:, None])
        e = torch.exp(s - m)
        denom = e.sum(dim=1)
        lse = torch.log(denom) + m[:, 0]
        if sink is not None:
            denom = denom + torch.exp(sink.double() - m[:, 0])
        out = (e @ k.double()) / denom[:, None]
        return out, lse
    # bf16: what a plain PyTorch implementation in bf16 computes.
    qb, kb = q.bfloat16(), k.bfloat16()
    s = (qb @ kb.T) * scale
    if sink is not None:
        s = torch.cat([s, sink.bfloat16()[:, None]], dim=1)
    p = torch.softmax(s, dim=1)
    if sink is not None:
        p = p[:, :-1]
    out = p @ kb
    lse = torch.logsumexp(s[:, : k.shape[0]].float(), dim=1)
    return out.float(), lse


def sparse_mla_decode_ref(
    q,
    k_cache,
    indices,
    lengths,
    scale,
    attn_sink=None,
    extra_k_cache=None,
    extra_indices=None,
    extra_lengths=None,
    num_heads=None,
    precision="fp64",
):
    """q ``[T, Hp, 512]``; caches ``[blocks, bs, 584]`` uint8; indices ``[T, W]`` global
    slots; lengths ``[T]``. Returns (out ``[T, Hp, 512]``, lse ``[T, Hp]``) for the
    first ``num_heads`` heads (the rest zero / -inf)."""
    T, Hp, _ = q.shape
    H = Hp if num_heads is None else num_heads
    dtype = _dtype(precision)
    out = torch.zeros(T, Hp, 512, dtype=dtype)
    lse = torch.full((T, Hp), float("-inf"), dtype=dtype)
    main_rows = k_cache.shape[0] * k_cache.shape[1]
    for t in range(T):
        n_main = indices.shape[1] if lengths is None else int(lengths[t])
        rows = [decode_rows(k_cache, _selected(indices[t], n_main, main_rows))]
        if extra_k_cache is not None:
            extra_rows = extra_k_cache.shape[0] * extra_k_cache.shape[1]
            n_extra = extra_indices.shape[1] if extra_lengths is None else int(extra_lengths[t])
            sel = _selected(extra_indices[t], n_extra, extra_rows)
            rows.append(decode_rows(extra_k_cache, sel))
        k = torch.cat(rows).float()
        sink = None if attn_sink is None else attn_sink[:H].float()
        out[t, :H], lse[t, :H] = _attend(q[t, :H].float(), k, scale, sink, precision)
    return out, lse


def sparse_mla_prefill_ref(q, kv, indices, scale, attn_sink=None, lengths=None, precision="fp64"):
    """q ``[T, H, 512]`` bf16; kv ``[S, 512]`` bf16; indices ``[T, W]``; lengths ``[T]``
    or None (all W). Returns (out ``[T, H, 512]``, lse ``[T, H]``)."""
    T, H, _ = q.shape
    dtype = _dtype(precision)
    out = torch.zeros(T, H, 512, dtype=dtype)
    lse = torch.full((T, H), float("-inf"), dtype=dtype)
    for t in range(T):
        n = indices.shape[1] if lengths is None else int(lengths[t])
        k = kv[_selected(indices[t], n, kv.shape[0])].float()
        sink = None if attn_sink is None else attn_sink.float()
        out[t], lse[t] = _attend(q[t].float(), k, scale, sink, precision)
    return out, lse
