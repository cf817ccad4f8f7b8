"""V4 KV record kernels for sm80/sm86: dequantize-and-gather, quantize-and-insert.

Both replace vLLM 0.33.0 functions of the same name and signature in
``vllm/models/deepseek_v41/common/ops/cache_utils.py``, whose Triton versions bitcast
to ``tl.float8e4nv`` (sm89+) and whose gather dispatcher prefers a CuteDSL kernel
using ``cvt.rn.f16x2.e4m3x2`` (sm89+). Here e4m3 is decoded and encoded in software
(``ops/fp8``) and UE8M0 scales become powers of two by bit placement.

The gather moves ``ROWS`` records per step: the NoPE bytes as one ``[ROWS, 8, 64]``
tile (7 real 64-column groups, one UE8M0 scale each; the 8th group is masked off to
keep shapes powers of two) and the bf16 RoPE tail as a ``[ROWS, 64]`` copy. Every
output element is written once, straight through ``out``'s strides (no temporary, no
extra copy).
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops._validate import check_int, check_paged_records, check_tensor
from deepinfer_sm80.ops.fp8.triton_fp8 import e4m3_ue8m0_to_bf16, f32_to_e4m3
from deepinfer_sm80.ops.kv_cache.layout import (
    HEAD_DIM,
    RECORD_BYTES,
    V41_MXFP8_RECORD_BYTES,
    V41_NVFP4_RECORD_BYTES,
)

_GATHER_MAX_PROGRAMS = 8192  # per request; programs loop over further tiles


# Not specialized (one compiled variant for every value, so the AOT entry covers every
# launch): the block table is read by gather, and the output row address is aligned by
# out_stride1 whatever the offset (0 for the compressed rows, the compressed count after).
@triton.jit(do_not_specialize=["block_table_stride", "offset"])
def kv_gather_v4_kernel(
    out_ptr,
    out_stride0,
    out_stride1,
    out_stride2,
    cache_ptr,
    page_stride,
    seq_lens_ptr,
    gather_lens_ptr,
    block_table_ptr,
    block_table_stride,
    offset,
    HAS_GATHER_LENS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
):
    i_w = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    n_w = tl.num_programs(0)

    seq_len = tl.load(seq_lens_ptr + i_b)
    if HAS_GATHER_LENS:
        gather_len = tl.load(gather_lens_ptr + i_b)
    else:
        gather_len = seq_len
    first_pos = seq_len - gather_len

    o_r = tl.arange(0, ROWS)
    o_g = tl.arange(0, 8)  # 64-column NoPE group; group 7 does not exist (masked)
    o_j = tl.arange(0, 64)
    m_nope = (o_g < 7)[None, :, None]  # [1, 8, 1]
    o_col = (o_g[:, None] * 64 + o_j[None, :])[None, :, :]  # [1, 8, 64]

    for r0 in range(i_w * ROWS, gather_len, n_w * ROWS):
        rows = r0 + o_r  # [ROWS]
        m_r = rows < gather_len
        pos = first_pos + rows
        page = tl.load(
            block_table_ptr + i_b * block_table_stride + pos // BLOCK_SIZE, mask=m_r, other=0
        ).to(tl.int64)
        slot = pos % BLOCK_SIZE
        p_page = cache_ptr + page * page_stride
        p_data = p_page + slot * 576  # [ROWS]
        p_scale = p_page + BLOCK_SIZE * 576 + slot * 8  # [ROWS]
        p_out = out_ptr + i_b * out_stride0 + (offset + rows).to(tl.int64) * out_stride1

        # Every load of the tile comes before its first store: with the RoPE load after
        # the NoPE store the gather took 3-4% longer at
        # 48K and 512K rows on an H200; stores may alias loads, so they stay in order.
        # Records are read once: let them leave L2 first.
        m_q = m_r[:, None, None] & m_nope
        b_q = tl.load(
            p_data[:, None, None] + o_col, mask=m_q, other=0, eviction_policy="evict_first"
        )  # [ROWS, 8, 64] u8: 7 groups of 64 e4m3 bytes
        b_s = tl.load(
            p_scale[:, None] + o_g[None, :], mask=m_r[:, None] & (o_g < 7)[None, :], other=0
        )  # [ROWS, 8] UE8M0, one per group
        p_rope = (p_data + 448).to(tl.pointer_type(tl.bfloat16))
        b_rope = tl.load(
            p_rope[:, None] + o_j[None, :], mask=m_r[:, None], eviction_policy="evict_first"
        )  # [ROWS, 64] bf16, copied as they are

        # The packed PTX decode (4 values per block, ~5.5 instructions a value), bit-
        # identical to the fp32 path: 1-2% faster than it at 48K and 512K rows (H200).
        # Each run of 4 values it packs must share a scale: true for 64-wide groups
        # (GPU-tested at the shipped launch config).
        b_nope = e4m3_ue8m0_to_bf16(b_q, tl.broadcast_to(b_s[:, :, None], (ROWS, 8, 64)))
        tl.store(p_out[:, None, None] + o_col * out_stride2, b_nope, mask=m_q)
        tl.store(p_out[:, None] + (448 + o_j)[None, :] * out_stride2, b_rope, mask=m_r[:, None])


@triton.jit
def kv_insert_v4_kernel(
    k_ptr,
    k_stride0,
    slot_mapping_ptr,
    cache_ptr,
    page_stride,
    BLOCK_SIZE: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + i_t).to(tl.int64)
    if slot >= 0:
        p_page = cache_ptr + (slot // BLOCK_SIZE) * page_stride
        row = slot % BLOCK_SIZE
        p_data = p_page + row * 576
        p_scale = p_page + BLOCK_SIZE * 576 + row * 8

        o_g = tl.arange(0, 8)
        o_j = tl.arange(0, 64)
        m_g = o_g < 7
        o_col = o_g[:, None] * 64 + o_j[None, :]  # [8, 64]
        p_k = k_ptr + i_t * k_stride0
        b_x = tl.load(p_k + o_col, mask=m_g[:, None], other=0.0).to(tl.float32)
        b_rope = tl.load(p_k + 448 + o_j)  # before any store, as in the gather

        # exponent = ceil(log2(max(amax, 1e-4) / 448)), computed exactly on the bits:
        # amax = m * 2**e with m in [1, 2) gives e - 8, plus 1 when m > 1.75.
        amax = tl.maximum(tl.max(tl.abs(b_x), axis=1), 1e-4)  # [8]
        bits = amax.to(tl.int32, bitcast=True)
        f32_exp = bits >> 23
        exponent = (f32_exp - 135) + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
        # A non-finite amax gets byte 255, as vLLM's clamp of exp2(inf) does.
        exponent = tl.where(f32_exp == 255, 128, exponent)
        inv_scale = (tl.maximum(127 - exponent, 1) << 23).to(tl.float32, bitcast=True)
        b_q = f32_to_e4m3(b_x * inv_scale[:, None])
        tl.store(p_data + o_col, b_q.to(tl.uint8), mask=m_g[:, None])

        b_s = tl.minimum(tl.maximum(exponent + 127, 0), 255)
        tl.store(p_scale + o_g, tl.where(m_g, b_s, 0).to(tl.uint8))

        tl.store((p_data + 448).to(tl.pointer_type(tl.bfloat16)) + o_j, b_rope)


def _check_cache(k_cache: torch.Tensor, block_size: int) -> None:
    check_tensor("k_cache", k_cache, dtype=torch.uint8, ndim=(2, 3))
    width = k_cache.shape[-1]
    if k_cache.dim() == 3 and width != RECORD_BYTES:
        if width in (V41_MXFP8_RECORD_BYTES, V41_NVFP4_RECORD_BYTES):
            raise ValueError(
                f"k_cache: {width}-byte records are vLLM's SM100-only V4.1 formats; on "
                f"Ampere vLLM 0.33.0 writes the {RECORD_BYTES}-byte V4 record "
                "(--kv-cache-dtype fp8 -> fp8_ds_mla)"
            )
        raise ValueError(
            f"k_cache: expected {RECORD_BYTES}-byte V4 records in the last dimension, "
            f"got shape {tuple(k_cache.shape)}"
        )
    if k_cache.dim() == 3 and k_cache.shape[1] != block_size:
        raise ValueError(
            f"block_size: {block_size} does not match k_cache.shape[1]="
            f"{k_cache.shape[1]} (tokens per page)"
        )
    check_paged_records("k_cache", k_cache, RECORD_BYTES, block_size)


def dequantize_and_gather_k_cache(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
    use_fnuz: bool = False,
    max_gather_len: int | None = None,
) -> None:
    """Gather and dequantize paged V4 K records into bf16 rows (vLLM 0.33.0 semantics).

    For request ``b`` and ``i`` in ``[0, gather_len)``, ``out[b, offset + i]`` becomes
    cache position ``seq_len - gather_len + i`` decoded: NoPE = e4m3 x 2**(s - 127) per
    64-dim group, RoPE copied. Rows outside that range are not touched.

    Args:
        out: ``[R, rows, 512]`` bf16, any strides (a view into a workspace is fine).
        k_cache: ``[num_blocks, block_size, 584]`` uint8, pages ``k_cache.stride(0)``
            bytes apart (data region, then scale region, then padding).
        seq_lens: ``[R]`` int32; for a compressed cache, ``seq_len // ratio``.
        gather_lens: ``[R]`` int32 or None (gather everything).
        block_table: ``[>= R, max_blocks]`` int32 page ids.
        block_size: tokens per page (compressed cache: kv block size // ratio).
        offset: first output row.
        use_fnuz: must be False: FNUZ e4m3 is ROCm's encoding, never written on CUDA.
        max_gather_len: upper bound of ``gather_len``, sizes the grid (as in vLLM).
    """
    if use_fnuz:
        raise ValueError(
            "use_fnuz: FNUZ e4m3 is written only by ROCm gfx942; Ampere caches are OCP "
            "e4m3fn, pass use_fnuz=False"
        )
    block_size = check_int("block_size", block_size, minimum=1)
    offset = check_int("offset", offset, minimum=0)
    _check_cache(k_cache, block_size)
    dev = k_cache.device
    check_tensor("out", out, dtype=torch.bfloat16, ndim=3, device=dev)
    if out.shape[-1] != HEAD_DIM:
        raise ValueError(f"out: expected last dimension {HEAD_DIM}, got {tuple(out.shape)}")
    check_tensor("seq_lens", seq_lens, dtype=torch.int32, ndim=1, device=dev)
    num_reqs = seq_lens.shape[0]
    if gather_lens is not None:
        check_tensor("gather_lens", gather_lens, dtype=torch.int32, ndim=1, device=dev)
        if gather_lens.shape[0] != num_reqs:
            raise ValueError(
                f"gather_lens: expected {num_reqs} entries (one per seq_lens entry), "
                f"got {gather_lens.shape[0]}"
            )
    check_tensor("block_table", block_table, dtype=torch.int32, ndim=2, device=dev)
    if block_table.shape[0] < num_reqs or out.shape[0] < num_reqs:
        raise ValueError(
            f"block_table and out need at least {num_reqs} rows (len(seq_lens)), got "
            f"{block_table.shape[0]} and {out.shape[0]}"
        )
    if offset > out.shape[1]:
        raise ValueError(f"offset: {offset} is past out's {out.shape[1]} rows")
    if max_gather_len is not None:
        check_int("max_gather_len", max_gather_len, minimum=0)
    if num_reqs == 0:
        return
    cfg = kernel_config("kv_cache.gather")
    rows_per_tile = cfg.constexpr_dict()["ROWS"]
    bound = out.shape[1] - offset
    if max_gather_len is not None:
        bound = min(bound, max_gather_len)
    programs = max(1, min(triton.cdiv(bound, rows_per_tile), _GATHER_MAX_PROGRAMS))
    kv_gather_v4_kernel[(programs, num_reqs)](
        out,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        k_cache,
        k_cache.stride(0),
        seq_lens,
        gather_lens if gather_lens is not None else seq_lens,
        block_table,
        block_table.stride(0),
        offset,
        HAS_GATHER_LENS=gather_lens is not None,
        BLOCK_SIZE=block_size,
        ROWS=rows_per_tile,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def quantize_and_insert_k_cache(
    k: torch.Tensor,
    k_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int = 64,
    is_ue8m0: bool = True,
    use_fnuz: bool = False,
    bytes_per_token: int = RECORD_BYTES,
) -> None:
    """Quantize bf16 K rows into 584-byte V4 records of a paged cache (vLLM 0.33.0).

    Row ``i < len(slot_mapping)`` goes to slot ``slot_mapping[i]`` (page
    ``slot // block_size``); negative slots are skipped. Per 64-dim NoPE group the UE8M0
    exponent is ``ceil(log2(max(amax, 1e-4) / 448))`` and values are ``x * 2**-exp``
    rounded to e4m3 (RNE, saturating); the 64 RoPE values are stored as bf16. The bytes
    equal what vLLM's GPU writer stores for finite inputs.

    Args:
        k: ``[>= T, 512]`` bf16 (extra rows, e.g. DP padding, are ignored).
        k_cache: ``[num_blocks, block_size, 584]`` or ``[num_blocks, page_bytes]`` uint8.
        slot_mapping: ``[T]`` int64 (int32 accepted).
        block_size: tokens per page.
        is_ue8m0, use_fnuz, bytes_per_token: only the V4 record with UE8M0 scales and
            OCP e4m3 exists on Ampere; other values are refused.
    """
    if not is_ue8m0:
        raise ValueError("is_ue8m0: only UE8M0 scales exist for this record; pass True")
    if use_fnuz:
        raise ValueError("use_fnuz: Ampere caches are OCP e4m3fn; pass use_fnuz=False")
    if bytes_per_token != RECORD_BYTES:
        raise ValueError(
            f"bytes_per_token: only the {RECORD_BYTES}-byte V4 record is written on "
            f"Ampere (got {bytes_per_token}; 528/288 are vLLM's SM100-only V4.1 records)"
        )
    block_size = check_int("block_size", block_size, minimum=1)
    _check_cache(k_cache, block_size)
    dev = k_cache.device
    check_tensor("k", k, dtype=torch.bfloat16, ndim=2, device=dev)
    if k.shape[1] != HEAD_DIM or k.stride(1) != 1:
        raise ValueError(f"k: expected [T, {HEAD_DIM}] with unit last stride, got {tuple(k.shape)}")
    check_tensor("slot_mapping", slot_mapping, dtype=(torch.int64, torch.int32), ndim=1, device=dev)
    num_tokens = slot_mapping.shape[0]
    if k.shape[0] < num_tokens:
        raise ValueError(f"k: has {k.shape[0]} rows but slot_mapping maps {num_tokens} tokens")
    if num_tokens == 0:
        return
    cfg = kernel_config("kv_cache.insert")
    kv_insert_v4_kernel[(num_tokens,)](
        k,
        k.stride(0),
        slot_mapping,
        k_cache,
        k_cache.stride(0),
        BLOCK_SIZE=block_size,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


_MODULE = "deepinfer_sm80.ops.kv_cache.triton_kernel"


def ampere_kernel_specs() -> list[KernelSpec]:
    """The configs this module ships, for the sm80/sm86 fitness tier."""
    specs = []
    gather = kernel_config("kv_cache.gather")
    insert = kernel_config("kv_cache.insert")
    # vLLM's block sizes: 64 (compressed), 32 (ratio-2 compressed), 256/128 (SWA).
    for block_size in (32, 64, 128, 256):
        for has_gather_lens in (False, True):
            specs.append(
                KernelSpec.from_jit(
                    f"kv_cache.gather[bs={block_size},gl={int(has_gather_lens)}]",
                    f"{_MODULE}:kv_gather_v4_kernel",
                    pointers={
                        "out_ptr": "*bf16",
                        "cache_ptr": "*u8",
                        "seq_lens_ptr": "*i32",
                        "gather_lens_ptr": "*i32",
                        "block_table_ptr": "*i32",
                    },
                    constexprs={
                        "out_stride2": 1,
                        "HAS_GATHER_LENS": has_gather_lens,
                        "BLOCK_SIZE": block_size,
                        "ROWS": gather.constexpr_dict()["ROWS"],
                    },
                    num_warps=gather.num_warps,
                    num_stages=gather.num_stages,
                    ints_divisible_by_16=("out_stride0", "out_stride1", "page_stride"),
                )
            )
        specs.append(
            KernelSpec.from_jit(
                f"kv_cache.insert[bs={block_size}]",
                f"{_MODULE}:kv_insert_v4_kernel",
                pointers={"k_ptr": "*bf16", "slot_mapping_ptr": "*i64", "cache_ptr": "*u8"},
                constexprs={"BLOCK_SIZE": block_size},
                num_warps=insert.num_warps,
                num_stages=insert.num_stages,
                ints_divisible_by_16=("k_stride0", "page_stride"),
            )
        )
    return specs


__all__ = [
    "ampere_kernel_specs",
    "dequantize_and_gather_k_cache",
    "quantize_and_insert_k_cache",
]
