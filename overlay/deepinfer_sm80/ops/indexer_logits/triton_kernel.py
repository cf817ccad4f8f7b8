"""Indexer logits for sm80/sm86: prefill (gathered keys) and paged decode, FP8 index K.

Both kernels compute ``logit = scale[key] * sum_h w[row, h] * relu(<q[row, h], k[key]>)``
(see ``ref.py``) for DeepSeek-V4.1's sparse attention indexer, which vLLM 0.33.0 runs
through DeepGEMM (sm_90+ only). The e4m3 queries and keys are decoded in software to
fp16 *exactly* (``e4m3_fp16.py``: values times 2**-8, undone with the key scale), so the
Tensor Core dot (fp16 x fp16 -> fp32) has exact products and the only rounding is fp32
accumulation: 128 terms per head dot, then ``HEADS`` weighted terms per logit.

One program stacks ``ROWS`` query rows x ``HEADS`` heads as the N side of the dot
(prefill: consecutive tokens, which share their keys; decode: a request's ``next_n``
rows), holds their decoded queries for its whole life, and walks ``BLOCK_N``-key tiles
as the M side: load bytes + scales, decode (packed PTX, four bytes at a time), one dot,
relu and weight, sum the heads, scale, store.
Each logit comes from exactly one program with the same arithmetic whatever the grid, so
the output is independent of the batch, of the split count and of the row grouping.
Programs along grid axis 1 take every ``n``-th tile of the row group's key range; there
is no cross-program reduction.

What gets written (``mqa_logits_into`` / ``paged_mqa_logits_into``):
- prefill: DeepGEMM's compressed layout, row ``m`` column ``j`` = key ``ks[m] + j`` for
  ``j < ke[m] - ks[m]`` (``ke`` clipped to the number of keys), and -inf in every later
  column: the whole ``[M, max_seqlen_k]`` output is defined (DeepGEMM leaves the tail
  unset; writing it costs ~nothing next to the dots).
- decode: row ``(b, j)`` column ``p`` = position ``p`` of request ``b`` for ``p <`` the
  row's length, -inf for ``p`` between that and the request's longest row, and columns
  past the request's longest row are *not written* (as DeepGEMM: rows are
  ``max_model_len`` wide, up to 4 MiB each, and every consumer stops at the row length).
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.arch import LaunchConfig, kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops._triton_utils import mma
from deepinfer_sm80.ops._validate import check_tensor
from deepinfer_sm80.ops.indexer_logits.e4m3_fp16 import (
    PRODUCT_UNSCALE,
    e4m3_to_f16_scaled_packed,
)
from deepinfer_sm80.ops.indexer_logits.layout import SCALE_BYTES

# BLOCK_N keys per step against STACK (row, head) pairs: a [128, STACK] fp16 query block
# held in registers, a [BLOCK_N, 128] key tile through shared memory, a [BLOCK_N, STACK]
# fp32 accumulator. Two stages let the next tile's bytes arrive (cp.async) during the
# current dot. Warps and tile picked on an H200 within what fits 48 KB of shared memory
# without spills (AOT tier); unmeasured on an Ampere GPU.

# Programs a launch aims for (grid axis 1 grows until rows x splits reach it): a few
# waves on 108 (A100) or 84 (A40/A6000) SMs. Any value gives the same output.
TARGET_PROGRAMS = 1024
# Columns per step of the prefill -inf tail.
TAIL_BLOCK = 256
_MAX_STACK = 128


@triton.jit
def _score_tile(q_t, w, k_bytes, k_scale, ROWS: tl.constexpr, HEADS: tl.constexpr):
    """Logits ``[BLOCK_N, ROWS]`` of one key tile (keys-major).

    ``q_t [D, ROWS * HEADS]`` decoded fp16 queries, transposed (columns row-major over
    rows, then heads), ``w [ROWS * HEADS]`` fp32 weights, ``k_bytes [BLOCK_N, D]`` e4m3
    bytes and ``k_scale [BLOCK_N]`` fp32.

    Keys are the dot's M side and (row, head) pairs its N side, so the head sum runs
    along N: inside each thread's accumulator fragment and across the lanes of a quad.
    With (row, head) as M it would be a reduction across warps, which
    Triton does through shared memory. Keys-major alone took 1.0-1.1x less time with 32
    pairs per program and in prefill, 1.3-1.8x with 64 pairs at 4 warps; with it, 2-4
    warps per program beat 4-8 (``benchmarks/results/NVIDIA_H200.indexer_logits_variants.log``).
    """
    k = e4m3_to_f16_scaled_packed(k_bytes)
    dots = mma(k, q_t)  # [BLOCK_N, ROWS * HEADS] fp32, carries 2**-16
    weighted = tl.maximum(dots, 0.0) * w[None, :]
    per_key = tl.sum(tl.reshape(weighted, (k_bytes.shape[0], ROWS, HEADS)), axis=2)
    return per_key * (k_scale * PRODUCT_UNSCALE)[:, None]


# Sizes that change every step, used only as bounds, are not specialized: one compiled
# variant serves every step (and the AOT entry every launch), whatever their value.
@triton.jit(do_not_specialize=["num_rows", "num_keys", "width"])
def mqa_logits_prefill_kernel(
    q_ptr,
    q_stride_m,
    q_stride_h,
    k_ptr,
    k_stride,
    k_scale_ptr,
    w_ptr,
    w_stride,
    ks_ptr,
    ke_ptr,
    out_ptr,
    out_stride,
    num_rows,
    num_keys,
    width,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TAIL: tl.constexpr,
):
    i_m = tl.program_id(0)
    i_s = tl.program_id(1)
    n_s = tl.num_programs(1)

    rows = i_m * ROWS + tl.arange(0, ROWS)
    m_row = rows < num_rows
    ks = tl.load(ks_ptr + rows, mask=m_row, other=0)
    ke = tl.minimum(tl.load(ke_ptr + rows, mask=m_row, other=0), num_keys)
    length = tl.minimum(tl.maximum(ke - ks, 0), width)
    key_end = ks + length
    # Keys of the whole row group; rows of one request share ks, so this is one range.
    hi = tl.max(tl.where(length > 0, key_end, 0))
    lo = tl.min(tl.where(length > 0, ks, hi))

    o_q = tl.arange(0, ROWS * HEADS)
    q_row = i_m * ROWS + o_q // HEADS
    m_q = q_row < num_rows
    o_d = tl.arange(0, HEAD_DIM)
    p_q = q_ptr + q_row.to(tl.int64)[:, None] * q_stride_m + (o_q % HEADS)[:, None] * q_stride_h
    q = e4m3_to_f16_scaled_packed(tl.load(p_q + o_d[None, :], mask=m_q[:, None], other=0))
    q_t = tl.trans(q)
    w = tl.load(w_ptr + q_row.to(tl.int64) * w_stride + o_q % HEADS, mask=m_q, other=0.0)

    p_out = out_ptr + rows.to(tl.int64) * out_stride  # [ROWS]
    o_n = tl.arange(0, BLOCK_N)
    for start in range(lo + i_s * BLOCK_N, hi, n_s * BLOCK_N):
        keys = start + o_n
        m_key = keys < hi
        k_bytes = tl.load(
            k_ptr + keys.to(tl.int64)[:, None] * k_stride + o_d[None, :],
            mask=m_key[:, None],
            other=0,
        )
        k_scale = tl.load(k_scale_ptr + keys, mask=m_key, other=0.0)
        logits = _score_tile(q_t, w, k_bytes, k_scale, ROWS, HEADS)  # [BLOCK_N, ROWS]
        m_out = (keys[:, None] >= ks[None, :]) & (keys[:, None] < key_end[None, :])
        tl.store(p_out[None, :] + (keys[:, None] - ks[None, :]), logits, mask=m_out)

    # -inf in every column past a row's keys, so the whole output is defined.
    tail_lo = tl.min(tl.where(m_row, length, width))
    o_t = tl.arange(0, TAIL)
    neg_inf = tl.full((ROWS, TAIL), float("-inf"), tl.float32)
    for c0 in range(tail_lo + i_s * TAIL, width, n_s * TAIL):
        cols = c0 + o_t
        m_t = m_row[:, None] & (cols[None, :] >= length[:, None]) & (cols[None, :] < width)
        tl.store(p_out[:, None] + cols[None, :], neg_inf, mask=m_t)


# Not specialized, as in the prefill kernel: bounds (num_pages, width, which is
# max_model_len) and the strides of per-request scalars (a lengths stride of 1 would
# otherwise compile a variant of its own).
@triton.jit(do_not_specialize=["lens_stride_b", "table_stride_b", "num_pages", "width"])
def paged_mqa_logits_kernel(
    q_ptr,
    q_stride_b,
    q_stride_n,
    q_stride_h,
    cache_ptr,
    page_stride,
    w_ptr,
    w_stride,
    lens_ptr,
    lens_stride_b,
    lens_stride_n,
    table_ptr,
    table_stride_b,
    table_stride_p,
    num_pages,
    out_ptr,
    out_stride,
    block_size,
    width,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NEXT_N: tl.constexpr,
    LENS_PER_ROW: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    i_s = tl.program_id(1)
    n_s = tl.num_programs(1)

    o_r = tl.arange(0, NEXT_N)
    if LENS_PER_ROW:
        length = tl.load(lens_ptr + b * lens_stride_b + o_r * lens_stride_n)
    else:
        # One length per request: row j of next_n sees len - next_n + 1 + j keys.
        length = tl.load(lens_ptr + b * lens_stride_b) - NEXT_N + 1 + o_r
    # Never past the output row or the request's block table.
    length = tl.minimum(tl.maximum(length, 0), tl.minimum(width, num_pages * block_size))
    req_len = tl.max(length)

    o_q = tl.arange(0, NEXT_N * HEADS)
    q_next = o_q // HEADS
    q_head = o_q % HEADS
    o_d = tl.arange(0, HEAD_DIM)
    p_q = q_ptr + b * q_stride_b + q_next * q_stride_n + q_head * q_stride_h
    q_t = tl.trans(e4m3_to_f16_scaled_packed(tl.load(p_q[:, None] + o_d[None, :])))
    w = tl.load(w_ptr + (b * NEXT_N + q_next) * w_stride + q_head)

    p_out = out_ptr + (b * NEXT_N + o_r) * out_stride  # [NEXT_N]
    p_table = table_ptr + b * table_stride_b
    o_n = tl.arange(0, BLOCK_N)
    for start in range(i_s * BLOCK_N, req_len, n_s * BLOCK_N):
        pos = start + o_n
        m_pos = pos < req_len
        page = tl.load(p_table + (pos // block_size) * table_stride_p, mask=m_pos, other=0)
        slot = pos % block_size
        p_page = cache_ptr + page.to(tl.int64) * page_stride  # [BLOCK_N]
        k_bytes = tl.load(
            p_page[:, None] + (slot * HEAD_DIM)[:, None] + o_d[None, :],
            mask=m_pos[:, None],
            other=0,
        )
        p_scale = (p_page + block_size * HEAD_DIM + slot * 4).to(tl.pointer_type(tl.float32))
        k_scale = tl.load(p_scale, mask=m_pos, other=0.0)
        logits = _score_tile(q_t, w, k_bytes, k_scale, NEXT_N, HEADS)  # [BLOCK_N, NEXT_N]
        logits = tl.where(pos[:, None] < length[None, :], logits, float("-inf"))
        tl.store(p_out[None, :] + pos[:, None], logits, mask=m_pos[:, None])


# ------------------------------------------------------------------ host side


def _e4m3_bytes(name: str, t: torch.Tensor, ndim: int, device=None) -> torch.Tensor:
    """An e4m3fn tensor as the uint8 view the kernels read (Triton refuses fp8e4nv on
    sm80, even as a pointer type)."""
    if isinstance(t, torch.Tensor) and t.dtype == torch.int8:
        raise ValueError(
            f"{name}: int8 means packed MXFP4, which vLLM uses only on sm_100 "
            "(indexer_kv_dtype='mxfp4'); Ampere runs the FP8 indexer cache"
        )
    check_tensor(name, t, dtype=(torch.float8_e4m3fn, torch.uint8), ndim=ndim, device=device)
    if t.shape[-1] and t.stride(-1) != 1:
        raise ValueError(f"{name}: the head dimension must be contiguous (stride 1)")
    return t.view(torch.uint8)


def _check_dims(heads: int, head_dim: int) -> None:
    for name, value, low, high in (("heads", heads, 16, 128), ("head_dim", head_dim, 16, 256)):
        if value < low or value > high or value & (value - 1):
            raise ValueError(
                f"q: {name} must be a power of two in [{low}, {high}] (DeepSeek-V4.1: "
                f"32 or 64 heads of 128), got {value}"
            )


def _check_weights(weights: torch.Tensor, rows: int, heads: int, device) -> None:
    check_tensor("weights", weights, dtype=torch.float32, ndim=2, device=device)
    if weights.shape[0] < rows or weights.shape[1] != heads or weights.stride(1) != 1:
        raise ValueError(
            f"weights: expected [{rows}, {heads}] fp32 with unit last stride (q's rows x "
            f"heads), got {tuple(weights.shape)} strides {weights.stride()}"
        )


def _check_out(out: torch.Tensor, rows: int, device) -> None:
    check_tensor("out", out, dtype=torch.float32, ndim=2, device=device)
    if out.shape[0] < rows or (out.shape[1] > 1 and out.stride(1) != 1):
        raise ValueError(
            f"out: expected >= {rows} rows of fp32 with unit column stride, got "
            f"{tuple(out.shape)} strides {out.stride()}"
        )


def _splits(row_groups: int, width: int, block_n: int) -> int:
    return max(
        1, min(triton.cdiv(TARGET_PROGRAMS, max(row_groups, 1)), triton.cdiv(width, block_n))
    )


def mqa_logits_into(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
) -> torch.Tensor:
    """Prefill indexer logits into ``out [M, W]`` (DeepGEMM's compressed layout).

    Row ``m`` gets keys ``[ks[m], min(ke[m], N))`` in columns ``[0, len)``, ``len``
    capped at ``W``, and -inf in columns ``[len, W)``: every element is written.

    Args:
        out: ``[M, W]`` fp32, unit column stride.
        q: ``[M, H, D]`` e4m3fn (or its uint8 bytes), unit stride over ``D``.
        k: ``[N, D]`` e4m3fn (or bytes): the gathered index keys.
        k_scale: ``[N]`` fp32 key scales (vLLM's ``[N, 4]`` uint8 viewed as fp32).
        weights: ``[M, H]`` fp32 head weights, query scale folded in.
        cu_seqlen_ks, cu_seqlen_ke: ``[M]`` int32 key range of each row (``ks >= 0``).
    """
    q_bytes = _e4m3_bytes("q", q, 3)
    dev = q.device
    rows, heads, head_dim = q_bytes.shape
    _check_dims(heads, head_dim)
    k_bytes = _e4m3_bytes("k", k, 2, dev)
    if k_bytes.shape[1] != head_dim:
        raise ValueError(f"k: expected [N, {head_dim}] (q's head_dim), got {tuple(k.shape)}")
    check_tensor("k_scale", k_scale, dtype=torch.float32, ndim=1, device=dev)
    if k_scale.shape[0] != k_bytes.shape[0] or (k_scale.numel() > 1 and k_scale.stride(0) != 1):
        raise ValueError(
            f"k_scale: expected [{k_bytes.shape[0]}] contiguous fp32 (one scale per key; "
            f"MX int32 scales are sm_100-only), got {tuple(k_scale.shape)}"
        )
    _check_weights(weights, rows, heads, dev)
    for name, t in (("cu_seqlen_ks", cu_seqlen_ks), ("cu_seqlen_ke", cu_seqlen_ke)):
        check_tensor(name, t, dtype=torch.int32, ndim=1, device=dev)
        if t.shape[0] != rows or (rows > 1 and t.stride(0) != 1):
            raise ValueError(f"{name}: expected [{rows}] contiguous int32, got {tuple(t.shape)}")
    _check_out(out, rows, dev)
    width = out.shape[1]
    if rows == 0 or width == 0:
        return out
    cfg = kernel_config("indexer_logits.prefill")
    consts = cfg.constexpr_dict()
    rows_per_program = max(1, consts["STACK"] // heads)
    row_groups = triton.cdiv(rows, rows_per_program)
    grid = (row_groups, _splits(row_groups, width, consts["BLOCK_N"]))
    mqa_logits_prefill_kernel[grid](
        q_bytes,
        q_bytes.stride(0),
        q_bytes.stride(1),
        k_bytes,
        k_bytes.stride(0),
        k_scale,
        weights,
        weights.stride(0),
        cu_seqlen_ks,
        cu_seqlen_ke,
        out,
        out.stride(0),
        rows,
        k_bytes.shape[0],
        width,
        HEADS=heads,
        HEAD_DIM=head_dim,
        ROWS=rows_per_program,
        BLOCK_N=consts["BLOCK_N"],
        TAIL=TAIL_BLOCK,
        **cfg.launch_options(),
    )
    return out


def _decode_config(next_n: int, heads: int) -> LaunchConfig:
    if next_n * heads <= 32:
        return kernel_config("indexer_logits.decode")
    return kernel_config("indexer_logits.decode_wide")


def paged_mqa_logits_into(
    out: torch.Tensor,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
) -> torch.Tensor:
    """Paged decode indexer logits into ``out [B * next_n, W]``.

    Row ``b * next_n + j`` sees ``L`` keys: ``context_lens[b, j]`` when there is one
    length per row, else ``context_lens[b] - next_n + 1 + j`` (clamped to ``[0, W]``
    and to the block table's capacity). Columns ``[0, L)`` get the logits of positions
    ``0..L-1``, columns ``[L, L_max)`` -inf (``L_max``: the request's longest row), the
    rest is not written.

    Args:
        out: ``[B * next_n, W]`` fp32 (W = vLLM's ``max_model_len // compress_ratio``).
        q: ``[B, next_n, H, D]`` e4m3fn (or bytes), unit stride over ``D``.
        kv_cache: ``[num_blocks, block_size, D + 4]`` or ``[num_blocks, block_size, 1,
            D + 4]`` uint8 (``layout.py``), pages ``stride(0)`` bytes apart.
        weights: ``[B * next_n, H]`` fp32.
        context_lens: ``[B]``, ``[B, 1]`` or ``[B, next_n]`` int32.
        block_tables: ``[B, max_pages]`` int32 page ids (any strides).
    """
    q_bytes = _e4m3_bytes("q", q, 4)
    dev = q.device
    batch, next_n, heads, head_dim = q_bytes.shape
    _check_dims(heads, head_dim)
    if next_n < 1 or next_n & (next_n - 1) or next_n * heads > _MAX_STACK:
        raise ValueError(
            f"q: next_n must be a power of two with next_n * heads <= {_MAX_STACK} (vLLM "
            f"on sm80 runs next_n 1 or 2 natively and flattens the rest), got next_n={next_n}, "
            f"heads={heads}"
        )
    check_tensor("kv_cache", kv_cache, dtype=torch.uint8, ndim=(3, 4), device=dev)
    if kv_cache.dim() == 4 and kv_cache.shape[2] != 1:
        raise ValueError(
            f"kv_cache: expected [blocks, block_size, 1, D+4], got {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[-1] != head_dim + SCALE_BYTES:
        raise ValueError(
            f"kv_cache: expected {head_dim + SCALE_BYTES} bytes per position ({head_dim} "
            f"e4m3 + fp32 scale; MXFP4 caches are sm_100-only), got {tuple(kv_cache.shape)}"
        )
    block_size = kv_cache.shape[1]
    page_stride = kv_cache.stride(0)
    if page_stride < block_size * (head_dim + SCALE_BYTES) or page_stride % 4:
        raise ValueError(
            f"kv_cache: page stride {page_stride} B must be a multiple of 4 and at least "
            f"block_size x {head_dim + SCALE_BYTES}; pass the cache as vLLM allocates it"
        )
    _check_weights(weights, batch * next_n, heads, dev)
    check_tensor("context_lens", context_lens, dtype=torch.int32, ndim=(1, 2), device=dev)
    per_row = context_lens.numel() == batch * next_n
    if context_lens.shape[0] != batch or not (per_row or context_lens.numel() == batch):
        raise ValueError(
            f"context_lens: expected [{batch}], [{batch}, 1] or [{batch}, {next_n}], got "
            f"{tuple(context_lens.shape)}"
        )
    check_tensor("block_tables", block_tables, dtype=torch.int32, ndim=2, device=dev)
    if block_tables.shape[0] < batch:
        raise ValueError(f"block_tables: expected >= {batch} rows, got {tuple(block_tables.shape)}")
    _check_out(out, batch * next_n, dev)
    width = out.shape[1]
    if batch == 0 or width == 0 or block_tables.shape[1] == 0:
        return out
    # Row j of a request reads lens_ptr + j * lens_stride_n only when there is one length
    # per row; 1 otherwise, so the compiled variant is the shipped one.
    lens_stride_n = context_lens.stride(1) if per_row and context_lens.dim() == 2 else 1
    cfg = _decode_config(next_n, heads)
    block_n = cfg.constexpr_dict()["BLOCK_N"]
    paged_mqa_logits_kernel[(batch, _splits(batch, width, block_n))](
        q_bytes,
        q_bytes.stride(0),
        q_bytes.stride(1),
        q_bytes.stride(2),
        kv_cache,
        page_stride,
        weights,
        weights.stride(0),
        context_lens,
        context_lens.stride(0),
        lens_stride_n,
        block_tables,
        block_tables.stride(0),
        block_tables.stride(1),
        block_tables.shape[1],
        out,
        out.stride(0),
        block_size,
        width,
        HEADS=heads,
        HEAD_DIM=head_dim,
        NEXT_N=next_n,
        LENS_PER_ROW=per_row,
        BLOCK_N=block_n,
        **cfg.launch_options(),
    )
    return out


# ------------------------------------------------------------------ Ampere fitness

_MODULE = "deepinfer_sm80.ops.indexer_logits.triton_kernel"
# DeepSeek-V4.1-Flash has 32 index heads (vLLM's config comments, the HF config as
# quoted in the shared docs); 64 is covered too (DeepGEMM serves 32 and 64).
SHIPPED_HEADS = (32, 64)


def ampere_kernel_specs() -> list[KernelSpec]:
    """The configs this module ships, for the sm80/sm86 fitness tier."""
    specs = []
    prefill = kernel_config("indexer_logits.prefill")
    pc = prefill.constexpr_dict()
    for heads in SHIPPED_HEADS:
        specs.append(
            KernelSpec.from_jit(
                f"indexer_logits.prefill[h={heads}]",
                f"{_MODULE}:mqa_logits_prefill_kernel",
                pointers={
                    "q_ptr": "*u8",
                    "k_ptr": "*u8",
                    "k_scale_ptr": "*fp32",
                    "w_ptr": "*fp32",
                    "ks_ptr": "*i32",
                    "ke_ptr": "*i32",
                    "out_ptr": "*fp32",
                },
                constexprs={
                    "HEADS": heads,
                    "HEAD_DIM": 128,
                    "ROWS": max(1, pc["STACK"] // heads),
                    "BLOCK_N": pc["BLOCK_N"],
                    "TAIL": TAIL_BLOCK,
                },
                num_warps=prefill.num_warps,
                num_stages=prefill.num_stages,
                ints_divisible_by_16=("q_stride_m", "q_stride_h", "k_stride", "w_stride"),
            )
        )
        for next_n in (1, 2):
            cfg = _decode_config(next_n, heads)
            for per_row in (False, True):
                specs.append(
                    KernelSpec.from_jit(
                        f"indexer_logits.decode[h={heads},n={next_n},row_lens={int(per_row)}]",
                        f"{_MODULE}:paged_mqa_logits_kernel",
                        pointers={
                            "q_ptr": "*u8",
                            "cache_ptr": "*u8",
                            "w_ptr": "*fp32",
                            "lens_ptr": "*i32",
                            "table_ptr": "*i32",
                            "out_ptr": "*fp32",
                        },
                        constexprs={
                            "lens_stride_n": 1,
                            "table_stride_p": 1,
                            "HEADS": heads,
                            "HEAD_DIM": 128,
                            "NEXT_N": next_n,
                            "LENS_PER_ROW": per_row,
                            "BLOCK_N": cfg.constexpr_dict()["BLOCK_N"],
                        },
                        num_warps=cfg.num_warps,
                        num_stages=cfg.num_stages,
                        ints_divisible_by_16=(
                            "q_stride_b",
                            "q_stride_n",
                            "q_stride_h",
                            "page_stride",
                            "w_stride",
                            "out_stride",
                            "block_size",
                        ),
                    )
                )
    return specs


__all__ = [
    "ampere_kernel_specs",
    "mqa_logits_into",
    "paged_mqa_logits_into",
]
