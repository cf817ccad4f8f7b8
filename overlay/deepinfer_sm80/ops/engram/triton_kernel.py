"""Engram table lookup for sm80/sm86: FP8 rows read as bytes, e4m3 decoded in software.

vLLM 0.33.0's ``_engram_lookup_kernel`` (``vllm/models/deepseek_v41/common/engram.py``)
takes the table as a ``float8_e4m3fn`` tensor, so Triton types it ``*fp8e4nv`` and
refuses to compile below sm_89 (it also casts peer pointers to that type). Every other
Engram kernel is integer/bf16/fp32 only and compiles for sm_80 as shipped.

``engram_lookup_kernel_override`` has the Triton kernel's exact parameter list, so
``vllm.triton_utils.dispatcher.register_kernels`` can route vLLM's own launch
(``ParallelEngramEmbedding.lookup``) to it unchanged: vLLM keeps choosing the grid, the
sort, the peer/host storage, and only the kernel body is ours. The override views the
table as uint8 and launches ``engram_lookup_u8_kernel`` over the same persistent grid.
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops._validate import check_int, check_tensor
from deepinfer_sm80.ops.fp8.triton_fp8 import e4m3_to_f32, ue8m0_to_f32

# One row per (token, head) moves 256 + 8 bytes from host memory (UVA) or HBM; a
# persistent grid of about one program per SM keeps 16 rows x SMs loads in flight, which
# covers PCIe latency without pipelining, so one stage and no shared memory.
# Unmeasured on an Ampere GPU.


@triton.jit(do_not_specialize=["vocab_start", "vocab_end", "num_rows", "out_stride"])
def engram_lookup_u8_kernel(
    weight,
    scales,
    ids,
    sorted_dst,
    out,
    vocab_start,
    vocab_end,
    num_rows,
    ids_stride_t,
    ids_stride_h,
    out_stride,
    HEAD_START: tl.constexpr,
    LOCAL_HEADS: tl.constexpr,
    TOTAL_HEADS: tl.constexpr,
    DIM: tl.constexpr,
    QUANT_BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SORTED: tl.constexpr,
    PACKED: tl.constexpr,
    PEER_ROWS: tl.constexpr,
):
    """Rows ``r < num_rows`` of one shard's Engram lookup; programs stride over tiles.

    Unsorted: row ``r`` is token ``r // LOCAL_HEADS``, head ``HEAD_START + r %
    LOCAL_HEADS``; its id is read from ``ids`` through the given strides and owned iff
    the head is real and the id is in ``[vocab_start, vocab_end)``. Sorted: ``ids[r]``
    is a shard-relative row and ``sorted_dst[r]`` the output row. Unowned rows write
    zeros. ``weight`` is the table's bytes, or with ``PEER_ROWS`` an int64 array of
    per-rank buffer addresses (``PEER_ROWS`` rows, then their scales, in each).
    """
    NUM_GROUPS: tl.constexpr = DIM // QUANT_BLOCK
    o_g = tl.arange(0, NUM_GROUPS)
    o_j = tl.arange(0, QUANT_BLOCK)
    o_col = (o_g[:, None] * QUANT_BLOCK + o_j[None, :])[None, :, :]  # [1, G, QB]

    for base in range(tl.program_id(0) * BLOCK_R, num_rows, tl.num_programs(0) * BLOCK_R):
        rows = base + tl.arange(0, BLOCK_R)
        valid = rows < num_rows
        if SORTED:
            local = tl.load(ids + rows, mask=valid, other=-1).to(tl.int64)
            dst = tl.load(sorted_dst + rows, mask=valid, other=0).to(tl.int64)
            owned = (local >= 0) & (local < vocab_end - vocab_start)
        else:
            head = HEAD_START + rows % LOCAL_HEADS
            token = (rows // LOCAL_HEADS).to(tl.int64)
            real = valid & (head < TOTAL_HEADS)
            index = tl.load(
                ids + token * ids_stride_t + head * ids_stride_h, mask=real, other=-1
            ).to(tl.int64)
            owned = real & (index >= vocab_start) & (index < vocab_end)
            local = index - vocab_start
            dst = rows.to(tl.int64)
        local = tl.where(owned, local, 0)

        if PEER_ROWS:
            owner = local // PEER_ROWS
            buffer = tl.load(weight + owner, mask=owned, other=0)
            local -= owner * PEER_ROWS
            row_values = buffer.to(tl.pointer_type(tl.uint8)) + local * DIM
            row_scales = (buffer + PEER_ROWS * DIM).to(tl.pointer_type(tl.uint8))
            row_scales += local * NUM_GROUPS
        else:
            row_values = weight + local * DIM
            row_scales = scales + local * NUM_GROUPS

        # Unowned rows load zero bytes: +0.0 values and a +0.0 scale, i.e. a zero row.
        b_v = tl.load(row_values[:, None, None] + o_col, mask=owned[:, None, None], other=0)
        b_s = tl.load(row_scales[:, None] + o_g[None, :], mask=owned[:, None], other=0)

        if PACKED:
            # Output row = token's packed block + head slot of DIM + NUM_GROUPS bytes.
            p_out = out + dst // LOCAL_HEADS * out_stride + dst % LOCAL_HEADS * (DIM + NUM_GROUPS)
            tl.store(p_out[:, None, None] + o_col, b_v, mask=valid[:, None, None])
            tl.store(p_out[:, None] + DIM + o_g[None, :], b_s, mask=valid[:, None])
        else:
            # e4m3 -> fp32 exactly, times 2**(s - 127) exactly, one bf16 rounding (RNE).
            b_x = e4m3_to_f32(b_v) * ue8m0_to_f32(b_s)[:, :, None]
            p_out = out + dst * DIM
            tl.store(p_out[:, None, None] + o_col, b_x.to(tl.bfloat16), mask=valid[:, None, None])


def _check_lookup_args(
    weight, scales, ids, sorted_dst, out, dim, quant_block, local_heads, sorted_, packed, peer
):
    if peer:
        check_tensor("weight", weight, dtype=torch.int64, ndim=1)
    else:
        check_tensor("weight", weight, dtype=(torch.float8_e4m3fn, torch.uint8), ndim=2)
        if weight.shape[1] != dim or (weight.shape[0] > 1 and weight.stride(0) != dim):
            raise ValueError(
                f"weight: expected contiguous rows of DIM={dim} bytes, got shape "
                f"{tuple(weight.shape)} strides {weight.stride()}"
            )
        check_tensor("scales", scales, dtype=torch.uint8, ndim=2)
        if scales.shape[1] != dim // quant_block or (
            scales.shape[0] > 1 and scales.stride(0) != dim // quant_block
        ):
            raise ValueError(
                f"scales: expected contiguous rows of DIM // QUANT_BLOCK={dim // quant_block} "
                f"UE8M0 bytes, got shape {tuple(scales.shape)} strides {scales.stride()}"
            )
    check_tensor("ids", ids, dtype=(torch.int32, torch.int64))
    if sorted_:
        check_tensor("sorted_dst", sorted_dst, dtype=(torch.int32, torch.int64))
    if packed:
        check_tensor("out", out, dtype=torch.uint8)
    else:
        check_tensor("out", out, dtype=torch.bfloat16)
    for name, value in (("DIM", dim), ("QUANT_BLOCK", quant_block)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name}: expected a power of two, got {value}")
    if quant_block > dim:
        raise ValueError(f"QUANT_BLOCK: {quant_block} is larger than DIM={dim}")
    check_int("LOCAL_HEADS", local_heads, minimum=1)


def engram_lookup_kernel_override(
    weight,
    scales,
    ids,
    sorted_dst,
    out,
    vocab_start,
    vocab_end,
    num_rows,
    ids_stride_t,
    ids_stride_h,
    HEAD_START,
    LOCAL_HEADS,
    TOTAL_HEADS,
    DIM,
    QUANT_BLOCK,
    BLOCK_R,
    GRID,
    SORTED,
    PACKED,
    OUT_STRIDE,
    PEER_ROWS=0,
):
    """Stand-in for vLLM 0.33.0's ``_engram_lookup_kernel`` launch, same parameters.

    Registered through ``register_kernels``, it receives the launch arguments of
    ``ParallelEngramEmbedding.lookup`` (the grid itself is not passed on; ``GRID`` is
    the program count vLLM chose, so it is launched as is). Semantics are vLLM's: per
    row, FP8 bytes times ``2**(s-127)`` per ``QUANT_BLOCK`` columns rounded to bf16 into
    ``out[dst]`` (``out`` contiguous ``[tokens, LOCAL_HEADS, DIM]``), or, if
    ``PACKED``, the row's bytes then its scale bytes into uint8 ``out`` (token stride
    ``OUT_STRIDE``, ``DIM + DIM // QUANT_BLOCK`` bytes per head). Ids outside
    ``[vocab_start, vocab_end)`` (DEAD_ID -1, other shards' rows) and padding heads
    ``>= TOTAL_HEADS`` give zero rows. Output rows ``>= num_rows`` are untouched.

    Args:
        weight: ``[rows, DIM]`` float8_e4m3fn (or uint8) table, host-pinned via UVA or
            on the GPU; with ``PEER_ROWS`` an int64 ``[ranks]`` array of peer buffer
            addresses instead.
        scales: ``[rows, DIM // QUANT_BLOCK]`` uint8 UE8M0 (unused with ``PEER_ROWS``).
        ids: ``[tokens, TOTAL_HEADS]`` int32/int64 global ids read with ``ids_stride_t``
            / ``ids_stride_h``; if ``SORTED``, ``[num_rows]`` shard-relative rows.
        sorted_dst: ``[num_rows]`` output row of each sorted id (read only if ``SORTED``).
    """
    sorted_ = bool(SORTED)
    packed = bool(PACKED)
    peer = int(PEER_ROWS)
    _check_lookup_args(
        weight, scales, ids, sorted_dst, out, DIM, QUANT_BLOCK, LOCAL_HEADS, sorted_, packed, peer
    )
    num_rows = check_int("num_rows", int(num_rows), minimum=0)
    if num_rows == 0:
        return
    programs = check_int("GRID", int(GRID), minimum=1)
    if not peer and weight.dtype != torch.uint8:
        weight = weight.view(torch.uint8)
    cfg = kernel_config("engram.lookup")
    engram_lookup_u8_kernel[(programs,)](
        weight,
        scales,
        ids,
        sorted_dst,
        out,
        vocab_start,
        vocab_end,
        num_rows,
        ids_stride_t,
        ids_stride_h,
        OUT_STRIDE,
        HEAD_START=HEAD_START,
        LOCAL_HEADS=LOCAL_HEADS,
        TOTAL_HEADS=TOTAL_HEADS,
        DIM=DIM,
        QUANT_BLOCK=QUANT_BLOCK,
        BLOCK_R=BLOCK_R,
        SORTED=sorted_,
        PACKED=packed,
        PEER_ROWS=peer,
        **cfg.launch_options(),
    )


_MODULE = "deepinfer_sm80.ops.engram.triton_kernel"

# DeepSeek-V4.1-Flash Engram: 3 n-gram orders x 8 heads = 24 hash heads of 256-dim rows,
# UE8M0 per 32 columns, 16-row tiles. Local heads per shard = ceil(24 / shards).
ENGRAM_TOTAL_HEADS = 24
ENGRAM_DIM = 256
ENGRAM_QUANT_BLOCK = 32
ENGRAM_BLOCK_R = 16


def ampere_kernel_specs() -> list[KernelSpec]:
    """The configs this module ships, for the sm80/sm86 fitness tier.

    The SM80 path looks up bf16 rows, unsorted (vLLM sorts only on SM100), from UVA host
    or GPU tables: TP 1/2/4/8 (24/12/6/3 local heads) and a padded last shard (5 shards:
    5 heads from head 20). The packed, sorted and peer variants are compiled too, so the
    override never meets an uncompiled mode.
    """
    cfg = kernel_config("engram.lookup")
    # (local heads, head start, sorted, packed, peer rows)
    variants = [
        (24, 0, False, False, 0),
        (12, 12, False, False, 0),
        (6, 18, False, False, 0),
        (3, 21, False, False, 0),
        (5, 20, False, False, 0),
        (24, 0, False, True, 0),
        (24, 0, True, False, 0),
        (24, 0, False, False, 1 << 20),
    ]
    specs = []
    for local_heads, head_start, sorted_, packed, peer_rows in variants:
        label = f"engram.lookup[lh={local_heads},hs={head_start}"
        label += ",sorted" * sorted_ + ",packed" * packed + ",peer" * bool(peer_rows) + "]"
        specs.append(
            KernelSpec.from_jit(
                label,
                f"{_MODULE}:engram_lookup_u8_kernel",
                # Pointer names follow vLLM's lookup kernel (no _ptr suffix).
                pointers={
                    "weight": "*i64" if peer_rows else "*u8",
                    "scales": "*u8",
                    "ids": "*i32",
                    "sorted_dst": "*i32",
                    "out": "*u8" if packed else "*bf16",
                },
                constexprs={
                    "ids_stride_h": 1,
                    "HEAD_START": head_start,
                    "LOCAL_HEADS": local_heads,
                    "TOTAL_HEADS": ENGRAM_TOTAL_HEADS,
                    "DIM": ENGRAM_DIM,
                    "QUANT_BLOCK": ENGRAM_QUANT_BLOCK,
                    "BLOCK_R": ENGRAM_BLOCK_R,
                    "SORTED": sorted_,
                    "PACKED": packed,
                    "PEER_ROWS": peer_rows,
                },
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
                # out_stride is not specialized (do_not_specialize): never divisible
                ints_divisible_by_16=("ids_stride_t",),
            )
        )
    return specs


__all__ = [
    "ampere_kernel_specs",
    "engram_lookup_kernel_override",
    "engram_lookup_u8_kernel",
]
