"""Sparse MLA decode and prefill through TileLang: the warp-per-scale-group kernels of
``attention_sm80.cuh`` (8 warps, each owning 64 of the 512 dims, so a record is decoded
once per CTA and no warp re-reads the query from shared memory): the wide kernel (16
heads x 16 rows per tile) and, for 8 heads per rank or fewer, the narrow one (MMAs
transposed so that n is the 8 heads, 32-row tiles; with arch.py ``HEAD_TILES``, 2 or 4
such n-tiles per CTA for more heads, measured slower and off). The head count is fixed per
deployment, so the choice keeps results batch-invariant. Prefill runs the same kernels
over the bf16 rows of vLLM's gather workspace (``launch_prefill``): no scales, one split
per token, 1.8-2.3x the Triton prefill kernel on the H200.

The kernel body is CUDA C++ imported with ``T.import_source`` and called from a
``T.Kernel``: it needs per-warp MMAs on warp-private tiles, which ``T.gemm``'s CTA-wide
warp policies do not express. TileLang still owns the build (nvcc, its disk cache keyed
by the TIR, target and pass configs), the launch on PyTorch's current stream and the
shared-memory allocation, exactly as for the mHC kernels.

It computes what ``sparse_mla_fwd_kernel`` computes for decode (the same split count per
token and partials layout; the rows are dealt evenly over a token's splits, so 640 rows
are 4 x 160, not 3 x 192 + 64, and the last CTA of a token merges the splits with the
Triton reduction's fold, so no reduction kernel follows). Only a GPU can run
it: the Triton interpreter does not apply, so its correctness tests are on the GPU tier
(``tests/ops/test_sparse_mla.py``) and CPU CI checks its Ampere fit (``ampere_fit``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from deepinfer_sm80 import tilelang_build
from deepinfer_sm80.arch import STATIC_SMEM_LIMIT_BYTES, kernel_config
from deepinfer_sm80.tilelang_build import get_kernel

DSPARK_SWA_WIDTH_K5 = 192  # vLLM: round_up(window 128 + K 5, 64)
PREFILL_WIDTHS = (640, 128)  # vLLM: round_up(topk + window, 128), topk 512 or 0

THREADS = 256  # 8 warps: one per 64-dim scale group
HEADS_PER_CTA = 16  # the wide kernel, attention_cta
ROWS_PER_TILE = 16  # its tile, and the granule of every split
# The narrow kernel (attention_cta_narrow) serves 8 heads or fewer per rank (TP8): MMAs
# transposed so that n = 8 heads, 32-row tiles.
NARROW_HEADS = 8
NARROW_ROWS = 32
HEAD_TILES = (1, 2, 4)  # the narrow kernel's n-tiles of 8 heads per CTA
SOURCE_FILE = Path(__file__).with_name("attention_sm80.cuh")
# Two CTAs per SM on sm_80 and sm_86: 128 registers per thread at most.
MIN_CTAS_PER_SM = 2
# The wide decode kernel's CTAs per SM (arch.py CTAS_PER_SM): 3 caps it at 80 registers
# for 50% more warps to hide latency; ptxas then spills 60-76 B per thread on sm_80/86,
# and three 48 KB CTAs fit sm_80's 164 KB per SM, not sm_86's 100 KB (ampere_fit refuses
# both: a measurement, not a shipped config).
WIDE_CTAS_PER_SM = (2, 3)


@dataclass(frozen=True)
class AttentionVariant:
    """Compile-time shape of one attention kernel, decode or (``bf16_rows``) prefill: index
    widths, optional inputs, split size."""

    main_width: int
    extra_width: int
    has_len: bool
    has_sink: bool
    rows_per_split: int
    prefetch: int = 1  # tiles whose loads are in flight ahead of the one computed (1 or 2)
    narrow: bool = False  # attention_cta_narrow: at most NARROW_HEADS heads per rank
    # Prefill: the kernel over bf16 rows of vLLM's gather workspace (no scales), one split
    # per token.
    bf16_rows: bool = False
    # The launch grid's order (arch.py SPLITS_FASTEST; cta_place in attention_sm80.cuh):
    # False, grid (tokens, head blocks, splits), token fastest; True, a 1-D grid whose CTA
    # i is split + max_splits * (head block + head blocks * token), so a token's splits
    # run side by side. Same bits as False on an H100 (NVIDIA_H100.ab_decode_grid_order.txt).
    splits_fastest: bool = False
    # The narrow kernel's n-tiles of 8 heads per CTA (kHeadTiles in attention_sm80.cuh): 1,
    # or 2 or 4 (16 or 32 heads; decode, register path for PV), which loads and decodes
    # each row once for all of them. Past 128 registers and 48 KB: one CTA per SM, shared
    # memory by opt-in (``smem_optin``).
    head_tiles: int = 1
    # The wide decode kernel's QK B fragments from the NoPE warps' decoded registers
    # (kQkRegisters in attention_sm80.cuh) instead of ldmatrix from their slices: the
    # query slice is loaded in the registers' dim order. arch.py QK_REGISTERS.
    qk_registers: bool = False
    # The wide decode kernel's minimum CTAs per SM, as ptxas is told
    # (__launch_bounds__): one of WIDE_CTAS_PER_SM. arch.py CTAS_PER_SM.
    ctas_per_sm: int = MIN_CTAS_PER_SM

    def __post_init__(self) -> None:
        if self.rows_per_split % ROWS_PER_TILE:
            raise ValueError(
                f"rows_per_split: must be a multiple of {ROWS_PER_TILE}, got {self.rows_per_split}"
            )
        if self.head_tiles not in HEAD_TILES:
            raise ValueError(f"head_tiles: one of {HEAD_TILES}, got {self.head_tiles}")
        if self.head_tiles > 1 and (not self.narrow or self.bf16_rows):
            raise ValueError(
                f"head_tiles={self.head_tiles}: n-tiles of heads are the narrow decode "
                "kernel's (narrow=True, bf16_rows=False)"
            )
        if self.qk_registers and (self.narrow or self.bf16_rows):
            raise ValueError(
                "qk_registers: QK from decoded registers is the wide decode kernel's "
                "(narrow=False, bf16_rows=False); the narrow kernel feeds QK from registers "
                "always"
            )
        if self.ctas_per_sm != MIN_CTAS_PER_SM and (self.narrow or self.bf16_rows):
            raise ValueError(
                f"ctas_per_sm={self.ctas_per_sm}: the CTAs per SM are a wide decode kernel "
                f"option (narrow=False, bf16_rows=False); others run {MIN_CTAS_PER_SM}"
            )
        if self.ctas_per_sm not in WIDE_CTAS_PER_SM:
            raise ValueError(f"ctas_per_sm: one of {WIDE_CTAS_PER_SM}, got {self.ctas_per_sm}")
        if self.narrow and self.prefetch != 1:
            raise ValueError(
                f"prefetch: the narrow kernel keeps 1 tile in flight, not {self.prefetch}"
            )
        if self.bf16_rows and (self.extra_width or self.max_splits != 1):
            raise ValueError(
                "bf16_rows: the prefill variant reads one cache with one split per token "
                f"(extra_width={self.extra_width}, rows_per_split={self.rows_per_split} for "
                f"{self.main_width} rows)"
            )

    @property
    def heads_per_cta(self) -> int:
        return NARROW_HEADS * self.head_tiles if self.narrow else HEADS_PER_CTA

    @property
    def has_extra(self) -> bool:
        return self.extra_width > 0

    @property
    def max_splits(self) -> int:
        return max(1, -(-(self.main_width + self.extra_width) // self.rows_per_split))

    @property
    def label(self) -> str:
        flags = ("" if self.has_len else ",nolen") + ("" if self.has_sink else ",nosink")
        op = "prefill" if self.bf16_rows else "decode"
        return (
            f"sparse_mla.{op}_tl[{self.main_width}+{self.extra_width},"
            f"r{self.rows_per_split},p{self.prefetch}{flags}"
            f"{f',h{self.heads_per_cta}' if self.narrow else ''}"
            f"{',splits-fastest' if self.splits_fastest else ''}"
            f"{',qk-regs' if self.qk_registers else ''}"
            f"{f',ctas{self.ctas_per_sm}' if self.ctas_per_sm != MIN_CTAS_PER_SM else ''}]"
        )

    @property
    def register_pv(self) -> bool:
        """The narrow kernel's register path for PV (``kRegisterPV`` in attention_sm80.cuh),
        taken exactly when its slices path would not fit Ampere's 48 KB: long splits'
        row tables. With short splits the register path is 6-13% slower (H200). Head
        tiles always take it."""
        return (
            self.narrow
            and not self.bf16_rows
            and (
                self.head_tiles > 1 or self._smem_bytes(register_pv=False) > STATIC_SMEM_LIMIT_BYTES
            )
        )

    @property
    def min_ctas_per_sm(self) -> int:
        return 1 if self.head_tiles > 1 else self.ctas_per_sm

    @property
    def smem_optin(self) -> bool:
        """More than 48 KB of shared memory per CTA (head tiles): held to the arch's opt-in
        limit per block (``arch.ArchLimits``), which TileLang's launcher requests."""
        return self.smem_bytes() > STATIC_SMEM_LIMIT_BYTES

    def threads(self) -> int:
        return THREADS

    def smem_bytes(self) -> int:
        """``sizeof(Smem<rows_per_split>)`` (``SmemNarrow`` for the narrow kernel) in
        attention_sm80.cuh (the kernel's static_assert refuses to compile if this is smaller)."""
        return self._smem_bytes(self.register_pv)

    def _smem_bytes(self, register_pv: bool) -> int:
        rps = self.rows_per_split
        if self.narrow:
            padded = -(-rps // NARROW_ROWS) * NARROW_ROWS
            # bf16 slices, sharing their space with the output stage: one per warp, or
            # with the register path only the RoPE warp's two (its cp.async double buffer)
            slices = (2 if register_pv else 8) * NARROW_ROWS * 64 * 2
            stage = NARROW_HEADS * 516 * 4  # one n-tile at a time
            heads = self.heads_per_cta
            sp = 8 * NARROW_ROWS * heads * 4
            ps = heads * (NARROW_ROWS + 8) * 2
            alpha = heads * 4
            table_rows = 1 if self.bf16_rows else padded  # bf16 rows have no scales
            scales_fields = -(-15 * table_rows // 4) * 4  # 7 + 8 bytes a row, then 4-aligned
            tables = 8 * padded + scales_fields  # record pointers, then the byte tables
            size = max(slices, stage) + sp + ps + alpha + tables + padded // 8
            return -(-size // 8) * 8
        ks = 8 * ROWS_PER_TILE * 72 * 2
        sp = 8 * HEADS_PER_CTA * ROWS_PER_TILE * 4
        ps = HEADS_PER_CTA * 24 * 2
        alpha = HEADS_PER_CTA * 4
        records = 8 * rps  # one pointer per row
        table_rows = 1 if self.bf16_rows else rps  # bf16 rows have no scales
        scales = -(-7 * table_rows // 8) * 8  # one byte per row and NoPE group, 8-aligned
        folds = 2 * 8 * table_rows  # one bf16 factor per row and group
        real_rows = 4 * -(-rps // 32)  # one bit per row
        size = ks + sp + ps + alpha + records + scales + folds + real_rows
        return -(-size // 8) * 8  # the struct's alignment: its pointers

    def callee(self) -> str:
        b = {True: "true", False: "false"}
        return (
            f"deepinfer_mla::{'attention_cta_narrow' if self.narrow else 'attention_cta'}"
            f"<{self.main_width}, {self.extra_width}, "
            f"{b[self.has_extra]}, {b[self.has_len]}, {b[self.has_sink]}, "
            f"{self.rows_per_split}, {self.max_splits}, {self.prefetch}, {self.smem_bytes()}, "
            f"{b[self.bf16_rows]}{(', ' + b[self.register_pv]) if self.narrow else ''}"
            f"{self._tail_arguments()}>"
        )

    def _tail_arguments(self) -> str:
        """The defaulted template arguments: kSplitsFastest, then kHeadTiles (narrow) or
        kQkRegisters (wide), each written only when it or a later one is not its default."""
        fastest = "true" if self.splits_fastest else "false"
        if self.head_tiles > 1:
            return f", {fastest}, {self.head_tiles}"
        if self.qk_registers:
            return f", {fastest}, true"
        return ", true" if self.splits_fastest else ""

    def build(self):
        """The TileLang PrimFunc. Every buffer travels as an address (``int64``) with its
        strides, validated by the Python wrapper; ``lse`` is a real tensor parameter so
        TileLang launches on PyTorch's current stream and sizes the grid from it."""
        import tilelang.language as T  # noqa: N812 -- TileLang's own spelling

        source = SOURCE_FILE.read_text()
        num_tokens = T.dynamic("num_tokens")
        padded_heads = T.dynamic("padded_heads")
        smem = self.smem_bytes()
        callee = self.callee()
        max_splits = self.max_splits
        heads_per_cta = self.heads_per_cta
        splits_fastest = self.splits_fastest
        min_ctas = self.min_ctas_per_sm

        def launch_grid(num_tokens, num_heads) -> tuple:
            """The grid of either order (``cta_place`` in attention_sm80.cuh decodes it)."""
            head_blocks = T.ceildiv(num_heads, heads_per_cta)
            if splits_fastest:
                return (num_tokens * head_blocks * max_splits,)
            return (num_tokens, head_blocks, max_splits)

        @T.prim_func
        def kernel(
            lse: T.Tensor((num_tokens, padded_heads), "float32"),
            q_addr: T.int64,
            q_stride_t: T.int64,
            q_stride_h: T.int64,
            out_addr: T.int64,
            out_stride_t: T.int64,
            out_stride_h: T.int64,
            max_logits_addr: T.int64,
            part_acc_addr: T.int64,
            part_ml_addr: T.int64,
            counters_addr: T.int64,
            main_addr: T.int64,
            main_stride: T.int64,
            main_rows: T.int32,
            main_bs: T.int32,
            main_idx_addr: T.int64,
            main_idx_stride: T.int64,
            main_len_addr: T.int64,
            extra_addr: T.int64,
            extra_stride: T.int64,
            extra_rows: T.int32,
            extra_bs: T.int32,
            extra_idx_addr: T.int64,
            extra_idx_stride: T.int64,
            extra_len_addr: T.int64,
            sink_addr: T.int64,
            scale_log2: T.float32,
            num_heads: T.int32,
        ):
            with T.Kernel(*launch_grid(num_tokens, num_heads), threads=THREADS):
                T.import_source(source)
                T.annotate_min_blocks_per_sm(min_ctas)
                buf = T.alloc_shared((smem,), "uint8")
                T.call_extern(
                    "handle",
                    callee,
                    q_addr,
                    q_stride_t,
                    q_stride_h,
                    out_addr,
                    out_stride_t,
                    out_stride_h,
                    T.address_of(lse[0, 0]),
                    padded_heads,
                    max_logits_addr,
                    part_acc_addr,
                    part_ml_addr,
                    counters_addr,
                    main_addr,
                    main_stride,
                    main_rows,
                    main_bs,
                    main_idx_addr,
                    main_idx_stride,
                    main_len_addr,
                    extra_addr,
                    extra_stride,
                    extra_rows,
                    extra_bs,
                    extra_idx_addr,
                    extra_idx_stride,
                    extra_len_addr,
                    sink_addr,
                    scale_log2,
                    num_heads,
                    T.address_of(buf[0]),
                )

        return kernel

    def pass_configs(self) -> dict:
        return tilelang_build.ampere_pass_configs()


DECODE_ENGINE_HINT = "DEEPINFER_SPARSE_MLA_DECODE=triton"
PREFILL_ENGINE_HINT = "DEEPINFER_SPARSE_MLA_PREFILL=triton"
_seen: set[AttentionVariant] = set()


def _note_first_use(variant: AttentionVariant) -> None:
    """Once per variant (not on every decode call): warn if warmup does not build it."""
    _seen.add(variant)
    if variant not in shipped_variants():
        logging.getLogger("deepinfer_sm80.sparse_mla").warning(
            "sparse MLA: %s is not among the variants warmup compiles; it compiles on first use",
            variant.label,
        )


def shipped_variants() -> list[AttentionVariant]:
    """What a DeepSeek-V4.1 server launches. Decode: SWA 128 + Top-K 512 (compressed
    layers), SWA 128 alone, and the DSpark draft layers' 192-row window, wide and narrow;
    prefill: the two index widths of the bf16 workspace. vLLM always passes the lengths
    and the sink. Decode's split size, prefetch depth and grid order are arch.py's; both
    kernels also ship the throughput split size for the widths past ROWS_PER_SPLIT
    (``engine.decode_rows_per_split``)."""
    cfg = kernel_config("sparse_mla.decode_tilelang").constexpr_dict()
    rps, prefetch = cfg["ROWS_PER_SPLIT"], cfg["PREFETCH"]
    order = {"splits_fastest": bool(cfg["SPLITS_FASTEST"])}
    qk_regs = bool(cfg.get("QK_REGISTERS", 0))
    ctas = int(cfg.get("CTAS_PER_SM", MIN_CTAS_PER_SM))
    widths = ((128, 512), (128, 0), (DSPARK_SWA_WIDTH_K5, 0))
    decode = [
        AttentionVariant(
            main,
            extra,
            True,
            True,
            rps,
            1 if narrow else prefetch,
            narrow,
            qk_registers=qk_regs and not narrow,
            ctas_per_sm=MIN_CTAS_PER_SM if narrow else ctas,
            **order,
        )
        for narrow in (False, True)
        for main, extra in widths
    ]
    decode += [
        AttentionVariant(
            main,
            extra,
            True,
            True,
            cfg["THROUGHPUT_ROWS_PER_SPLIT"],
            1 if narrow else prefetch,
            narrow,
            qk_registers=qk_regs and not narrow,
            ctas_per_sm=MIN_CTAS_PER_SM if narrow else ctas,
            **order,
        )
        for narrow in (False, True)
        for main, extra in widths
        if main + extra > rps
    ]
    # arch.py HEAD_TILES > 1: the narrow kernel with n-tiles of heads for 16 heads (2) and
    # up to HEAD_TILES (decode_kernel_shape), at both split sizes.
    split_sizes = (rps, cfg["THROUGHPUT_ROWS_PER_SPLIT"])
    decode += [
        AttentionVariant(main, extra, True, True, size, 1, True, head_tiles=tiles, **order)
        for tiles in HEAD_TILES
        if 1 < tiles <= cfg["HEAD_TILES"]
        for main, extra in widths
        for size in split_sizes
        if size == rps or main + extra > rps
    ]
    # Prefill index rows: round_up(topk + window, 128) wide (vLLM's
    # combine_topk_swa_indices): 640 with Top-K 512, 128 for SWA-only layers.
    prefill = [
        prefill_variant(width, True, True, narrow)
        for narrow in (False, True)
        for width in PREFILL_WIDTHS
    ]
    return decode + prefill


def fit_reports(ccs=(80, 86)) -> list:
    """``ampere_fit.FitReport`` per shipped variant and architecture (nvcc + ptxas -v
    through ``tilelang_build``, as the mHC kernels are measured)."""
    return tilelang_build.fit_reports(shipped_variants(), ccs)


def warmup(log=print, aot_dir: Path | None = None) -> list[dict]:
    """Compile (or load from TileLang's cache) every shipped variant for this GPU, after
    copying the image's AOT builds (``aot_dir``: ``DEEPINFER_AOT_DIR/sparse_mla``, built
    by ``python -m deepinfer_sm80.aot build``) into that cache."""
    return tilelang_build.warm(shipped_variants(), "sparse MLA", aot_dir, "auto", log)


# The last CTA of a split token merges the splits inside the decode kernel
# (attention_sm80.cuh, last_split_to_arrive): no reduction launch follows. A fixed choice per
# process, so a token's bits never depend on the batch (the merge and the Triton reduction
# fold in the same order but need not round alike).
MERGE_SPLITS = True

# The in-kernel merge's arrival counters, one int32 per (token, head block), per device
# (keyed by the tensors' device type and index). Zero between launches (the last CTA
# resets its counter), so they are zeroed once, when allocated, never per call. Grown by
# replacement; a replaced buffer is kept alive because CUDA graphs captured earlier hold
# its address.
_counters: dict[tuple, object] = {}
_kept_alive: list = []


def decode_kernel_shape(heads: int) -> tuple[bool, int]:
    """``(narrow, head_tiles)`` of the decode kernel for ``heads`` per rank: the narrow
    kernel for 8 or fewer; above that the wide kernel, or with arch.py's ``HEAD_TILES`` > 1
    the narrow kernel with up to that many n-tiles of 8 heads (no more than the heads
    fill: 16 heads take 2). Fixed per deployment, so batch-invariant."""
    if heads <= NARROW_HEADS:
        return True, 1
    most = kernel_config("sparse_mla.decode_tilelang").constexpr_dict().get("HEAD_TILES", 1)
    if most not in HEAD_TILES:
        raise ValueError(
            f"arch.py sparse_mla.decode_tilelang HEAD_TILES: one of {HEAD_TILES}, got {most}"
        )
    if most == 1:
        return False, 1
    needed = -(-heads // NARROW_HEADS)
    enough = [t for t in HEAD_TILES if t >= needed]
    return True, min(most, enough[0] if enough else HEAD_TILES[-1])


def counter_slots(tokens: int, heads: int) -> int:
    """One counter per (token, head block) of the launch grid."""
    narrow, tiles = decode_kernel_shape(heads)
    per_cta = NARROW_HEADS * tiles if narrow else HEADS_PER_CTA
    return tokens * -(-heads // per_cta)


def split_counters(device, slots: int):
    """A zeroed int32 buffer of at least ``slots`` counters on ``device``.

    Decode calls share it and leave it zero, so calls that run at the same time on one
    device (two streams) must not both use it. vLLM runs a model's layers one at a time
    on one stream; its dual-batch overlap keeps both micro-batches' compute on one stream
    too (``vllm/v1/worker/gpu_ubatch_wrapper.py``: one compute stream for all contexts).
    Sized at warmup (``reserve_split_counters``) so that no CUDA-graph capture has to
    allocate. If a capture needs more all the same, that graph gets its own buffer,
    zeroed by a memset node at the start of each replay (correct, about 1-2 us slower)."""
    import torch

    device = torch.device(device)
    key = (device.type, device.index)
    buf = _counters.get(key)
    if buf is not None and buf.numel() >= slots:
        return buf
    size = max(slots, 2 * buf.numel() if buf is not None else 4096)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        logging.getLogger("deepinfer_sm80.sparse_mla").warning(
            "sparse MLA decode: %d split counters needed inside a CUDA-graph capture, %d "
            "reserved; this graph zeroes its own on every replay (call "
            "reserve_split_counters with the largest batch before capturing)",
            slots,
            buf.numel() if buf is not None else 0,
        )
        own = torch.zeros(size, dtype=torch.int32, device=device)
        _kept_alive.append(own)
        return own
    new = torch.zeros(size, dtype=torch.int32, device=device)
    if buf is not None:
        _kept_alive.append(buf)
    _counters[key] = new
    return new


def reserve_split_counters(device, max_tokens: int, max_heads: int = 64) -> None:
    """Size the counters for up to ``max_tokens`` decode tokens before any CUDA-graph
    capture (the server's warmup does, with vLLM's max_num_batched_tokens)."""
    split_counters(device, counter_slots(max_tokens, max_heads))


def _check_bf16_pairs(op: str, hint: str, **tensors) -> None:
    """The kernels move q and out as 32-bit pairs of bf16: each must be 4-byte aligned
    with even strides."""
    for name, t in tensors.items():
        if t.data_ptr() % 4 or t.stride(0) % 2 or t.stride(1) % 2:
            raise ValueError(
                f"{name}: the TileLang {op} needs a 4-byte-aligned tensor with even "
                f"strides (address % 4 = {t.data_ptr() % 4}, strides {t.stride()}); pass "
                f"a contiguous tensor or set {hint}"
            )


def _q_out_args(q, out) -> tuple:
    """The kernels' first arguments after lse: q and out as addresses with their strides."""
    return (q.data_ptr(), q.stride(0), q.stride(1), out.data_ptr(), out.stride(0), out.stride(1))


def launch(
    q,
    out,
    lse,
    main,
    main_idx,
    main_len,
    extra,
    extra_idx,
    extra_len,
    attn_sink,
    scale_log2: float,
    heads: int,
    rows_per_split: int,
    prefetch: int,
    part_acc,
    part_ml,
    counters=None,
) -> None:
    """Run the decode kernel on tensors the wrapper (``ops.sparse_mla_decode``)
    has validated: all on q's device, caches ``[blocks, bs, 584]`` uint8 with
    16-byte-aligned pages, index rows ``[T, W]`` int32 with unit stride, contiguous
    lengths and sink, ``lse`` a fresh contiguous ``[T, Hp]`` f32. ``part_acc``/``part_ml``
    are the split partials (ignored with one split); with ``counters`` (``split_counters``)
    the kernel merges them itself, else the caller launches the reduction. The kernel moves
    q and out as 32-bit pairs: both must be 4-byte aligned with even strides (checked
    here)."""
    _check_bf16_pairs("decode", DECODE_ENGINE_HINT, q=q, out=out)
    cfg = kernel_config("sparse_mla.decode_tilelang").constexpr_dict()
    if (cfg["BLOCK_H"], cfg["BLOCK_N"]) != (HEADS_PER_CTA, ROWS_PER_TILE):
        raise ValueError(
            f"arch.py sparse_mla.decode_tilelang: BLOCK_H/BLOCK_N are the kernel's fixed "
            f"tile ({HEADS_PER_CTA}/{ROWS_PER_TILE}), got {cfg['BLOCK_H']}/{cfg['BLOCK_N']}"
        )
    narrow, head_tiles = decode_kernel_shape(heads)
    variant = AttentionVariant(
        main_width=main_idx.shape[1],
        extra_width=extra_idx.shape[1] if extra is not None else 0,
        has_len=main_len is not None,
        has_sink=attn_sink is not None,
        rows_per_split=rows_per_split,
        prefetch=1 if narrow else prefetch,
        narrow=narrow,
        splits_fastest=bool(cfg["SPLITS_FASTEST"]),
        head_tiles=head_tiles,
        qk_registers=bool(cfg.get("QK_REGISTERS", 0)) and not narrow,
        ctas_per_sm=MIN_CTAS_PER_SM if narrow else int(cfg.get("CTAS_PER_SM", MIN_CTAS_PER_SM)),
    )
    if variant not in _seen:
        # A variant warmup did not build compiles on first use (about 2 s, with nvcc):
        # outside warmup that can land in a CUDA-graph capture or a request.
        _note_first_use(variant)
    has_extra = extra is not None
    get_kernel(variant)(
        lse,
        *_q_out_args(q, out),
        0,  # max logits: prefill only
        part_acc.data_ptr(),
        part_ml.data_ptr(),
        counters.data_ptr() if counters is not None else 0,
        main.data_ptr(),
        main.stride(0),
        main.shape[0] * main.shape[1],
        main.shape[1],
        main_idx.data_ptr(),
        main_idx.stride(0),
        main_len.data_ptr() if main_len is not None else 0,
        extra.data_ptr() if has_extra else 0,
        extra.stride(0) if has_extra else 0,
        extra.shape[0] * extra.shape[1] if has_extra else 0,
        extra.shape[1] if has_extra else 1,
        extra_idx.data_ptr() if has_extra else 0,
        extra_idx.stride(0) if has_extra else 0,
        extra_len.data_ptr() if has_extra else 0,
        attn_sink.data_ptr() if attn_sink is not None else 0,
        scale_log2,
        heads,
    )


def launch_prefill(q, out, lse, max_logits, kv, idx, lens, attn_sink, scale_log2: float, heads):
    """Prefill through the attention kernels over bf16 rows (``AttentionVariant.bf16_rows``; the
    narrow kernel for 8 heads or fewer, as for decode), on
    tensors ``ops.sparse_mla_prefill`` has validated: ``kv`` ``[S, 512]`` bf16
    rows, ``idx`` ``[T, W]`` int32 rows into it, ``lens`` ``[T]`` or None, ``lse`` and
    ``max_logits`` fresh ``[T, H]`` f32. One split per token, no partials. The kernel
    moves rows in 16-byte pieces and q/out as 32-bit pairs: misaligned tensors are refused
    (checked here)."""
    row_bytes = kv.stride(0) * kv.element_size()
    if kv.data_ptr() % 16 or row_bytes % 16:
        raise ValueError(
            f"kv: the TileLang prefill reads 16-byte pieces of each row (address % 16 = "
            f"{kv.data_ptr() % 16}, row stride {row_bytes} bytes); pass a contiguous "
            f"workspace or set {PREFILL_ENGINE_HINT}"
        )
    _check_bf16_pairs("prefill", PREFILL_ENGINE_HINT, q=q, out=out)
    if lse.stride() != max_logits.stride():
        raise ValueError("max_logits: must have lse's layout (the kernel writes both alike)")
    variant = prefill_variant(
        idx.shape[1], lens is not None, attn_sink is not None, narrow=heads <= NARROW_HEADS
    )
    if variant not in _seen:
        _note_first_use(variant)
    get_kernel(variant)(
        lse,
        *_q_out_args(q, out),
        max_logits.data_ptr(),
        lse.data_ptr(),  # partials: one split, never touched
        lse.data_ptr(),
        0,  # no split counters
        kv.data_ptr(),
        row_bytes,  # a "page" per row: block size 1
        kv.shape[0],
        1,
        idx.data_ptr(),
        idx.stride(0),
        lens.data_ptr() if lens is not None else 0,
        # no extra cache: address, page stride, rows, block size, index rows, their
        # stride, lengths
        0,
        0,
        0,
        1,
        0,
        0,
        0,
        attn_sink.data_ptr() if attn_sink is not None else 0,
        scale_log2,
        heads,
    )


def prefill_variant(
    width: int, has_len: bool, has_sink: bool, narrow: bool = False
) -> AttentionVariant:
    """The prefill kernel for index rows of ``width`` entries: one split of all of them
    (rounded up to whole 16-row tiles); the narrow kernel for 8 heads per rank or fewer,
    as for decode."""
    rows = max(ROWS_PER_TILE, -(-width // ROWS_PER_TILE) * ROWS_PER_TILE)
    return AttentionVariant(width, 0, has_len, has_sink, rows, 1, narrow, True)
