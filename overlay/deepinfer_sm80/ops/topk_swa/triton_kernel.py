"""Index kernels for sparse MLA on sm80/sm86: Top-K + SWA combination, global slots.

``combine_topk_swa_indices`` replaces vLLM 0.33.0's ``torch.full(-1)`` + per-request
worker-loop kernel with one CTA per query token that writes its whole output row as
three disjoint regions: Top-K ``[0, topk_len)``, SWA ``[topk_len, topk_len + swa_len)``
and the -1 tail. Each element is written once, by one thread, with no prior fill.

``compute_global_topk_indices_and_lens`` keeps vLLM's one-program-per-token design
(it is integer-only and already runs on sm80) with a block width that follows the
row width instead of a fixed 1024.
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops._validate import check_int, check_tensor
from deepinfer_sm80.ops.topk_swa.ref import combined_width

_REQ_CHUNK = 64  # requests examined per step when locating a token's request


@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "M", "N"])
def combine_topk_swa_kernel(
    combined_ptr,
    combined_stride,
    lens_ptr,
    topk_ptr,
    topk_stride,
    query_start_loc_ptr,
    seq_lens_ptr,
    gather_lens_ptr,
    num_tokens,
    num_reqs,
    M,
    N,
    TOP_K: tl.constexpr,
    COMPRESS_RATIO: tl.constexpr,
    WINDOW_SIZE: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_W: tl.constexpr,
    REQ_CHUNK: tl.constexpr,
):
    i_t = tl.program_id(0)
    o_w = tl.arange(0, BLOCK_W)
    m_w = o_w < WIDTH
    p_row = combined_ptr + i_t.to(tl.int64) * combined_stride

    # The token's request: how many requests end at or before token i_t (the
    # query_start_loc slice is global, so rebase it on its first entry).
    base = tl.load(query_start_loc_ptr)
    req = 0
    for r0 in range(0, num_reqs, REQ_CHUNK):
        o_r = r0 + tl.arange(0, REQ_CHUNK)
        ends = tl.load(query_start_loc_ptr + 1 + o_r, mask=o_r < num_reqs, other=0) - base
        req += tl.sum(((ends <= i_t) & (o_r < num_reqs)).to(tl.int32), axis=0)

    topk_len = 0
    swa_len = 0
    swa_first = 0
    covered = (req < num_reqs) & (i_t < num_tokens)
    if covered:
        q_start = tl.load(query_start_loc_ptr + req) - base
        q_end = tl.load(query_start_loc_ptr + req + 1) - base
        seq_len = tl.load(seq_lens_ptr + req)
        gather_start = seq_len - tl.load(gather_lens_ptr + req)
        pos = seq_len - (q_end - q_start) + (i_t - q_start)
        if COMPRESS_RATIO > 0:
            topk_len = tl.maximum(tl.minimum((pos + 1) // COMPRESS_RATIO, TOP_K), 0)
        swa_start = tl.maximum(tl.maximum(pos - (WINDOW_SIZE - 1), 0), gather_start)
        swa_len = tl.maximum(pos - swa_start + 1, 0)
        swa_first = req * M + N + swa_start - gather_start - topk_len
        # Region 1: Top-K entries; out-of-pool candidates stay -1 inside the count.
        m_topk = o_w < topk_len
        b_idx = tl.load(topk_ptr + i_t.to(tl.int64) * topk_stride + o_w, mask=m_topk, other=-1)
        b_topk = tl.where((b_idx >= 0) & (b_idx < N), b_idx + req * M, -1)
    else:
        b_topk = tl.full((BLOCK_W,), -1, tl.int32)
        m_topk = o_w < 0
    # Region 2: the SWA rows [swa_start, pos] of this request's gathered tail.
    m_swa = (o_w >= topk_len) & (o_w < topk_len + swa_len)
    # Region 3: -1 up to the row width.
    b_row = tl.where(m_topk, b_topk, tl.where(m_swa, swa_first + o_w, -1))
    tl.store(p_row + o_w, b_row, mask=m_w)
    if i_t < num_tokens:
        tl.store(lens_ptr + i_t, topk_len + swa_len)


# block_table_stride is not specialized: the table is read by gather, so its divisibility
# buys nothing, and one variant serves every max_model_len.
@triton.jit(do_not_specialize=["block_table_stride"])
def global_topk_slots_kernel(
    slots_ptr,
    slots_stride,
    lens_ptr,
    topk_ptr,
    topk_stride,
    token_to_req_ptr,
    block_table_ptr,
    block_table_stride,
    is_valid_token_ptr,
    WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    req = tl.load(token_to_req_ptr + i_t).to(tl.int64)
    token_valid = tl.load(is_valid_token_ptr + i_t).to(tl.int1)
    o_w = tl.arange(0, BLOCK_W)
    m_w = o_w < WIDTH
    b_idx = tl.load(topk_ptr + i_t * topk_stride + o_w, mask=m_w, other=-1)
    m_valid = b_idx >= 0
    b_page = tl.load(
        block_table_ptr + req * block_table_stride + b_idx // BLOCK_SIZE,
        mask=m_w & m_valid,
        other=0,
    )
    b_slot = tl.where(m_valid, b_page * BLOCK_SIZE + b_idx % BLOCK_SIZE, -1)
    tl.store(slots_ptr + i_t * slots_stride + o_w, b_slot, mask=m_w)
    count = tl.sum(m_valid.to(tl.int32), axis=0)
    tl.store(lens_ptr + i_t, tl.where(token_valid, count, 0))


def combine_topk_swa_indices(
    topk_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prefill query token, indices into the bf16 gather workspace (vLLM 0.33.0).

    The workspace holds ``M`` rows per request: ``[0, N)`` the dequantized compressed
    history, ``[N, M)`` the dequantized SWA tail (gathered from ``seq_len -
    gather_len``). See ``ref.combine_topk_swa_indices_ref`` for the row rule.

    Args:
        topk_indices: ``[T, >= topk]`` int32 local compressed positions (-1 = none).
        query_start_loc: ``[R + 1]`` int32, global offsets (rebased on element 0).
        seq_lens, gather_lens: ``[R]`` int32.
        window_size: sliding window (128 for DeepSeek-V4.1).
        compress_ratio: 0 (SWA-only layer), 1 or 2 for V4.1.
        topk: valid Top-K width (512), 0 for SWA-only layers.
        M, N: workspace rows per request and the SWA region start.
        out: optional ``(indices [>= T, round_up(topk + window, 128)], lens [same rows])``
            int32 workspace; every row of it is rewritten.

    Returns:
        ``(combined_indices, combined_lens)``; rows no request covers are all -1 with
        length 0 (vLLM leaves such lengths unwritten; no consumer reads them).
    """
    check_tensor("topk_indices", topk_indices, dtype=torch.int32, ndim=2)
    dev = topk_indices.device
    check_tensor("query_start_loc", query_start_loc, dtype=torch.int32, ndim=1, device=dev)
    check_tensor("seq_lens", seq_lens, dtype=torch.int32, ndim=1, device=dev)
    check_tensor("gather_lens", gather_lens, dtype=torch.int32, ndim=1, device=dev)
    num_reqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_reqs + 1 or gather_lens.shape[0] != num_reqs:
        raise ValueError(
            f"query_start_loc must have len(seq_lens) + 1 = {num_reqs + 1} entries and "
            f"gather_lens {num_reqs}; got {query_start_loc.shape[0]} and {gather_lens.shape[0]}"
        )
    window_size = check_int("window_size", window_size, minimum=1)
    compress_ratio = check_int("compress_ratio", compress_ratio, minimum=0)
    topk = check_int("topk", topk, minimum=0)
    check_int("M", M, minimum=0)
    check_int("N", N, minimum=0)
    if N > M:
        raise ValueError(f"N: the SWA region start ({N}) cannot exceed the row stride M ({M})")
    if compress_ratio > 0 and topk > topk_indices.shape[1]:
        raise ValueError(
            f"topk: {topk} exceeds topk_indices' row width {topk_indices.shape[1]}; pass "
            "the index_topk the indexer wrote"
        )
    if topk_indices.shape[1] > 0 and topk_indices.stride(1) != 1:
        raise ValueError("topk_indices: rows must be contiguous (unit last stride)")
    width = combined_width(topk, window_size)
    num_tokens = topk_indices.shape[0]
    if out is None:
        combined = torch.empty((num_tokens, width), dtype=torch.int32, device=dev)
        lens = torch.empty((num_tokens,), dtype=torch.int32, device=dev)
    else:
        combined, lens = out
        check_tensor("out[0]", combined, dtype=torch.int32, ndim=2, device=dev)
        check_tensor("out[1]", lens, dtype=torch.int32, ndim=1, device=dev)
        if combined.shape[1] != width or combined.stride(1) != 1:
            raise ValueError(
                f"out[0]: expected contiguous rows of width round_up(topk + window, 128) = "
                f"{width}, got shape {tuple(combined.shape)}"
            )
        if combined.shape[0] < num_tokens or lens.shape[0] < num_tokens:
            raise ValueError(
                f"out: needs at least {num_tokens} rows (topk_indices rows), got "
                f"{combined.shape[0]} and {lens.shape[0]}"
            )
    rows = combined.shape[0]
    if rows == 0:
        return combined, lens
    cfg = kernel_config("topk_swa.combine")
    combine_topk_swa_kernel[(rows,)](
        combined,
        combined.stride(0),
        lens,
        topk_indices,
        topk_indices.stride(0),
        query_start_loc,
        seq_lens,
        gather_lens,
        min(num_tokens, lens.shape[0]),
        num_reqs,
        M,
        N,
        TOP_K=topk,
        COMPRESS_RATIO=compress_ratio,
        WINDOW_SIZE=window_size,
        WIDTH=width,
        BLOCK_W=triton.next_power_of_2(width),
        REQ_CHUNK=_REQ_CHUNK,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return combined, lens


def compute_global_topk_indices_and_lens(
    topk_indices: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_valid_token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map local compressed positions to paged slots (decode), vLLM 0.33.0 semantics.

    ``slot = block_table[req, idx // block_size] * block_size + idx % block_size``; -1
    stays -1; ``topk_lens[t]`` counts the entries >= 0 and is 0 where
    ``is_valid_token`` is False.

    Args:
        topk_indices: ``[T, K]`` int32.
        token_to_req_indices: ``[>= T]`` int32 request of each token.
        block_table: ``[R, max_blocks]`` int32.
        block_size: compressed tokens per page.
        is_valid_token: ``[>= T]`` bool (int tensors accepted, nonzero = valid).

    Returns:
        ``(global_slots [T, K] int32, topk_lens [T] int32)``.
    """
    check_tensor("topk_indices", topk_indices, dtype=torch.int32, ndim=2)
    dev = topk_indices.device
    check_tensor(
        "token_to_req_indices", token_to_req_indices, dtype=torch.int32, ndim=1, device=dev
    )
    check_tensor("block_table", block_table, dtype=torch.int32, ndim=2, device=dev)
    check_tensor(
        "is_valid_token", is_valid_token, dtype=(torch.bool, torch.int32), ndim=1, device=dev
    )
    block_size = check_int("block_size", block_size, minimum=1)
    num_tokens, width = topk_indices.shape
    if token_to_req_indices.shape[0] < num_tokens or is_valid_token.shape[0] < num_tokens:
        raise ValueError(
            f"token_to_req_indices and is_valid_token need >= {num_tokens} entries "
            f"(topk_indices rows), got {token_to_req_indices.shape[0]} and "
            f"{is_valid_token.shape[0]}"
        )
    if width > 0 and topk_indices.stride(1) != 1:
        raise ValueError("topk_indices: rows must be contiguous (unit last stride)")
    slots = torch.empty((num_tokens, width), dtype=torch.int32, device=dev)
    lens = torch.empty((num_tokens,), dtype=torch.int32, device=dev)
    if num_tokens == 0:
        return slots, lens
    cfg = kernel_config("topk_swa.global_topk")
    global_topk_slots_kernel[(num_tokens,)](
        slots,
        slots.stride(0),
        lens,
        topk_indices,
        topk_indices.stride(0),
        token_to_req_indices,
        block_table,
        block_table.stride(0),
        is_valid_token,
        WIDTH=width,
        BLOCK_SIZE=block_size,
        BLOCK_W=triton.next_power_of_2(max(width, 1)),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return slots, lens


_MODULE = "deepinfer_sm80.ops.topk_swa.triton_kernel"


def ampere_kernel_specs() -> list[KernelSpec]:
    """The configs this module ships, for the sm80/sm86 fitness tier.

    DeepSeek-V4.1: top-k 512 (0 on SWA-only layers), window 128 and, for DSpark draft
    layers, a window widened to round_up(128 + K); ratios 0, 1, 2.
    """
    combine = kernel_config("topk_swa.combine")
    glob = kernel_config("topk_swa.global_topk")
    specs = []
    for ratio, topk in ((0, 0), (1, 512), (2, 512)):
        width = combined_width(topk, 128)
        specs.append(
            KernelSpec.from_jit(
                f"topk_swa.combine[ratio={ratio},topk={topk}]",
                f"{_MODULE}:combine_topk_swa_kernel",
                pointers={
                    "combined_ptr": "*i32",
                    "lens_ptr": "*i32",
                    "topk_ptr": "*i32",
                    "query_start_loc_ptr": "*i32",
                    "seq_lens_ptr": "*i32",
                    "gather_lens_ptr": "*i32",
                },
                constexprs={
                    "TOP_K": topk,
                    "COMPRESS_RATIO": ratio,
                    "WINDOW_SIZE": 128,
                    "WIDTH": width,
                    "BLOCK_W": triton.next_power_of_2(width),
                    "REQ_CHUNK": _REQ_CHUNK,
                },
                num_warps=combine.num_warps,
                num_stages=combine.num_stages,
                # The combined rows are round_up(topk + window, 128) wide and contiguous;
                # vLLM's Top-K rows are 512 wide (SWA-only layers: no Top-K rows to read).
                ints_divisible_by_16=("combined_stride", "topk_stride")
                if topk
                else ("combined_stride",),
            )
        )
    for block_size in (32, 64):
        specs.append(
            KernelSpec.from_jit(
                f"topk_swa.global_topk[bs={block_size}]",
                f"{_MODULE}:global_topk_slots_kernel",
                pointers={
                    "slots_ptr": "*i32",
                    "lens_ptr": "*i32",
                    "topk_ptr": "*i32",
                    "token_to_req_ptr": "*i32",
                    "block_table_ptr": "*i32",
                    # vLLM's is_valid_token is a bool tensor, which Triton types *u1
                    "is_valid_token_ptr": "*u1",
                },
                constexprs={"WIDTH": 512, "BLOCK_SIZE": block_size, "BLOCK_W": 512},
                num_warps=glob.num_warps,
                num_stages=glob.num_stages,
                # slots are allocated here as [tokens, 512]; vLLM's Top-K rows are 512 wide
                ints_divisible_by_16=("slots_stride", "topk_stride"),
            )
        )
    return specs


__all__ = [
    "ampere_kernel_specs",
    "combine_topk_swa_indices",
    "compute_global_topk_indices_and_lens",
]
