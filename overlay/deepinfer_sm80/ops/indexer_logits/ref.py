"""PyTorch references for the sparse indexer's logits, plus the baselines the benchmark times.

The formula (DeepGEMM's ``fp8_fp4_mqa_logits`` / ``fp8_fp4_paged_mqa_logits``, which
vLLM's ``fp8_mqa_logits_torch`` / ``fp8_paged_mqa_logits_torch`` also compute):

    logit[row, key] = scale[key] * sum_h w[row, h] * relu(<q[row, h, :], k[key, :]>)

with ``q`` and ``k`` e4m3fn values, ``scale`` the key's fp32 scale and ``w`` the fp32
per-head weight (vLLM folds the query's own scale into it). Since ``scale > 0``, it
commutes with the relu: applying it before the relu (vLLM's references) or after the head
sum (DeepGEMM, our kernels) is the same number up to rounding.

``*_ref`` (the oracles): values decoded with torch's ``float8_e4m3fn`` conversion, every
product and sum in float64, one rounding to fp32 at the end. Each <q, k> is then exact
(128 products of 4-bit significands, all multiples of 2**-18 below 2**18, need 43 bits),
and the rest carries float64 rounding only (~2**-50 relative), so a kernel's error
against these is its own accumulation error. With ``magnitude=True`` they return, in
float64, ``scale * sum_h |w_h| * sum_d |q_hd * k_d|``: the scale error bounds are
stated in.

``*_torch_*`` (benchmark baselines): the algorithms of vLLM's torch references, written
to run on a GPU at production sizes (see each docstring).
"""

import torch

from deepinfer_sm80.ops.indexer_logits.layout import AMAX_FLOOR, E4M3_MAX, page_views

NEG_INF = float("-inf")


def decode_e4m3(x: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """e4m3fn values (``float8_e4m3fn`` or raw uint8 bytes) -> ``dtype``, exactly."""
    if x.dtype == torch.uint8:
        x = x.view(torch.float8_e4m3fn)
    return x.to(torch.float32).to(dtype)


def _scores(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, magnitude: bool
) -> torch.Tensor:
    """``[R, H, D]`` q, ``[N, D]`` k, ``[R, H]`` w, ``[N]`` scale -> ``[R, N]`` float64."""
    qd, kd = decode_e4m3(q), decode_e4m3(k)
    w64, s64 = w.to(torch.float64), scale.to(torch.float64)
    if magnitude:
        dots = torch.einsum("rhd,nd->rhn", qd.abs(), kd.abs())
        return (dots * w64.abs()[..., None]).sum(1) * s64
    dots = torch.einsum("rhd,nd->rhn", qd, kd)
    return (dots.clamp_min(0) * w64[..., None]).sum(1) * s64


def mqa_logits_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    max_seqlen_k: int,
    magnitude: bool = False,
) -> torch.Tensor:
    """Prefill logits in DeepGEMM's compressed layout: ``[M, max_seqlen_k]`` fp32.

    Row ``m`` holds keys ``[ks, ke)`` (``ke`` clipped to ``len(k)``) from column 0;
    columns past ``ke - ks`` are -inf (our kernels write them; DeepGEMM leaves them
    unset). ``q [M, H, D]``, ``k [N, D]`` e4m3fn (or bytes), ``k_scale [N]`` fp32,
    ``weights [M, H]`` fp32.
    """
    rows = q.shape[0]
    fill = 0.0 if magnitude else NEG_INF
    out = torch.full((rows, max_seqlen_k), fill, dtype=torch.float64, device=q.device)
    for m in range(rows):
        start = int(cu_seqlen_ks[m])
        end = min(int(cu_seqlen_ke[m]), k.shape[0])
        length = max(0, min(end - start, max_seqlen_k))
        if length == 0:
            continue
        keys = slice(start, start + length)
        scores = _scores(q[m : m + 1], k[keys], weights[m : m + 1], k_scale[keys], magnitude)
        out[m, :length] = scores[0]
    return out if magnitude else out.to(torch.float32)


def row_lengths(context_lens: torch.Tensor, batch_size: int, next_n: int) -> torch.Tensor:
    """Keys each decode row sees, ``[batch_size * next_n]`` int64.

    ``context_lens`` with one entry per row (``[B, next_n]``) gives them directly; one per
    request (``[B]`` or ``[B, 1]``) means row ``j`` of ``next_n`` sees
    ``len - next_n + 1 + j`` (clamped at 0), as vLLM's decode top-k derives them.
    """
    lens = context_lens.reshape(-1).to(torch.int64)
    if lens.numel() == batch_size * next_n:
        return lens
    offsets = torch.arange(next_n, dtype=torch.int64, device=lens.device) - next_n + 1
    return (lens[:batch_size, None] + offsets[None, :]).clamp_min(0).reshape(-1)


def gather_keys(
    kv_cache: torch.Tensor, block_table_row: torch.Tensor, length: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``[0, length)`` of one request: (values ``[length, D]`` uint8, scales)."""
    values, scales = page_views(kv_cache, block_size)
    pos = torch.arange(length, device=kv_cache.device)
    pages = block_table_row[pos // block_size].long()
    return values[pages, pos % block_size], scales[pages, pos % block_size]


def paged_mqa_logits_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_model_len: int,
    magnitude: bool = False,
) -> torch.Tensor:
    """Decode logits ``[B * next_n, max_model_len]`` fp32; -inf past each row's length.

    ``q [B, next_n, H, D]`` e4m3fn, ``kv_cache`` the paged layout of ``layout.py``,
    ``weights [B * next_n, H]``, ``block_tables [B, pages]``; row lengths per
    ``row_lengths``, clipped to ``max_model_len``.
    """
    batch, next_n = q.shape[:2]
    block_size = kv_cache.shape[1]
    lens = row_lengths(context_lens, batch, next_n).clamp(max=max_model_len)
    fill = 0.0 if magnitude else NEG_INF
    out = torch.full((batch * next_n, max_model_len), fill, dtype=torch.float64, device=q.device)
    for b in range(batch):
        for j in range(next_n):
            row, length = b * next_n + j, int(lens[b * next_n + j])
            if length == 0:
                continue
            vals, scales = gather_keys(kv_cache, block_tables[b], length, block_size)
            out[row, :length] = _scores(
                q[b, j : j + 1], vals, weights[row : row + 1], scales, magnitude
            )[0]
    return out if magnitude else out.to(torch.float32)


# ------------------------------------------------------------------ index-K writer


def quantize_index_k_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys ``[T, D]`` -> (e4m3fn bytes ``[T, D]``, fp32 scales ``[T]``) by vLLM's FP8 rule.

    ``exp = ceil(log2(max(amax, 1e-4) / 448))``, scale ``2**exp``, values
    ``clamp(x * 2**-exp, +-448)`` rounded by torch's e4m3fn conversion.
    """
    x = x.to(torch.float32)
    amax = x.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    exponent = torch.ceil(torch.log2(amax / E4M3_MAX))
    scaled = (x * torch.exp2(-exponent)[:, None]).clamp(-E4M3_MAX, E4M3_MAX)
    return scaled.to(torch.float8_e4m3fn).view(torch.uint8), torch.exp2(exponent)


def insert_index_k_ref(
    values: torch.Tensor, scales: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store key ``i`` at slot ``slots[i]`` (page ``slot // block_size``) of the cache."""
    block_size = kv_cache.shape[1]
    cache_values, cache_scales = page_views(kv_cache, block_size)
    slots = slots.long()
    cache_values[slots // block_size, slots % block_size] = values
    cache_scales[slots // block_size, slots % block_size] = scales


# ------------------------------------------------------------------ benchmark baselines


def mqa_logits_torch_bf16_einsum(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    row_chunk: int = 64,
) -> torch.Tensor:
    """Prefill baseline: the algorithm of vLLM's ``fp8_mqa_logits_torch`` (from DeepGEMM's
    tests): q and k cast to bf16, one bf16 ``einsum`` over all heads and keys, times the
    key scale, relu, times the weights, summed over heads, -inf outside ``[ks, ke)``.

    Returns the full ``[M, N]`` layout (key ``n`` in column ``n``), as vLLM's reference
    does. Rows are processed ``row_chunk`` at a time so the ``[H, rows, N]`` score
    tensor fits a GPU at production sizes; the maths per row is unchanged.
    """
    kb = decode_e4m3(k, torch.bfloat16)
    scale = k_scale.reshape(-1)
    cols = torch.arange(k.shape[0], device=k.device)
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float32, device=q.device)
    for r0 in range(0, q.shape[0], row_chunk):
        rows = slice(r0, r0 + row_chunk)
        qb = decode_e4m3(q[rows], torch.bfloat16)
        score = torch.einsum("mhd,nd->hmn", qb, kb).float() * scale
        logits = (score.relu() * weights[rows].transpose(0, 1)[..., None]).sum(dim=0)
        inside = (cols[None, :] >= cu_seqlen_ks[rows, None]) & (
            cols[None, :] < cu_seqlen_ke[rows, None]
        )
        out[rows] = logits.masked_fill(~inside, NEG_INF)
    return out


def paged_mqa_logits_torch_loop(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_model_len: int,
) -> torch.Tensor:
    """Decode baseline (``next_n == 1``): the algorithm of vLLM's
    ``fp8_paged_mqa_logits_torch``: a Python loop over requests, each gathering its
    pages, decoding keys to fp32, ``F.linear`` against the fp32 query heads, relu,
    times the weights, summed over heads, times the key scale; -inf elsewhere.

    Pages are read through ``page_views`` so padded page strides work (vLLM's version
    assumes unpadded pages). The loop bounds come from ``context_lens`` as host integers:
    pass it as a CPU tensor to keep a device-to-host sync out of a timed call.
    """
    batch, next_n = q.shape[:2]
    if next_n != 1:
        raise ValueError("paged_mqa_logits_torch_loop: next_n must be 1 (vLLM's fp32 path)")
    block_size = kv_cache.shape[1]
    values, scales = page_views(kv_cache, block_size)
    out = torch.full((batch, max_model_len), NEG_INF, dtype=torch.float32, device=q.device)
    lens = context_lens.reshape(-1).tolist()
    for b in range(batch):
        length = min(int(lens[b]), max_model_len)
        if length == 0:
            continue
        pages = block_tables[b, : -(-length // block_size)].long()
        keys = decode_e4m3(values[pages].reshape(-1, values.shape[-1]), torch.float32)
        score = torch.nn.functional.linear(keys, decode_e4m3(q[b, 0], torch.float32))
        score = (score.relu() * weights[b][None, :]).sum(dim=1) * scales[pages].reshape(-1)
        out[b, :length] = score[:length]
    return out
