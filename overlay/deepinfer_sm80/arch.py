"""Per-architecture limits and the kernel launch configs we ship, as data.

Kernels never autotune on the serving path: each op reads its config from
``KERNEL_CONFIGS`` here. The Ampere fitness tier (``deepinfer_sm80.ampere_fit``)
compiles exactly these configs for sm_80 and sm_86 on a CPU machine, so a config
that does not fit Ampere fails CI instead of a user's server.

Shared-memory figures are NVIDIA's (CUDA C Programming Guide, "Compute Capabilities"):
opt-in per block 163 KB on sm80 and 99 KB on sm86, per SM 164 KB and 100 KB, of which
the driver reserves 1 KB per resident block; 48 KB is the static limit every CTA of ours
stays under so the same config runs on both. A kernel's CTAs per SM must also fit the
SM's shared memory: ``min_ctas_per_sm * (shared + 1 KB)``.
"""

from dataclasses import dataclass

STATIC_SMEM_LIMIT_BYTES = 48 * 1024
RESERVED_SMEM_PER_BLOCK_BYTES = 1024  # the driver's, per resident block (cc 8.x and 9.0)


@dataclass(frozen=True)
class ArchLimits:
    """What one compute capability offers a single CTA."""

    name: str
    capability: tuple[int, int]
    optin_smem_per_block_bytes: int
    smem_per_sm_bytes: int
    max_regs_per_thread: int = 255

    @property
    def cc(self) -> int:
        return self.capability[0] * 10 + self.capability[1]


SM80 = ArchLimits("sm80", (8, 0), optin_smem_per_block_bytes=166_912, smem_per_sm_bytes=167_936)
SM86 = ArchLimits("sm86", (8, 6), optin_smem_per_block_bytes=101_376, smem_per_sm_bytes=102_400)
AMPERE_ARCHES = (SM80, SM86)

# The Hopper architecture the Ampere kernels can be built for as a proxy (``aot build
# --hopper-proxy``): an H100/H200 runs them when the plugin is forced on
# (DEEPINFER_FORCE=1), which is how this project measures them beside vLLM's own path.
HOPPER_PROXY_CC = 90
# A100/A800; RTX 30xx, A40, A10, A6000 (8.9 is Ada, not Ampere)
AMPERE_CCS = tuple(a.cc for a in AMPERE_ARCHES)


def arch_limits(arch: str) -> ArchLimits:
    """The limits a build for ``arch`` (``sm_80``, ``sm_86``) is held to; a Hopper-proxy
    build (``sm_90``, ``aot build --hopper-proxy``) is held to sm86's, the smaller Ampere."""
    for a in AMPERE_ARCHES:
        if arch == f"sm_{a.cc}":
            return a
    if arch == f"sm_{HOPPER_PROXY_CC}":
        return SM86
    raise ValueError(f"no limits for {arch!r}: expected sm_80, sm_86 or sm_{HOPPER_PROXY_CC}")


@dataclass(frozen=True)
class LaunchConfig:
    """One shipped launch config: warps, pipeline stages and block constexprs."""

    num_warps: int
    num_stages: int = 1
    constexprs: tuple[tuple[str, int], ...] = ()
    maxnreg: int | None = None

    def launch_options(self) -> dict[str, int]:
        """Keyword arguments for a Triton launch."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            opts["maxnreg"] = self.maxnreg
        return opts

    def constexpr_dict(self) -> dict[str, int]:
        return dict(self.constexprs)


# Chosen by measurement (benchmarks/); identical on sm80 and sm86 so far.
KERNEL_CONFIGS: dict[str, LaunchConfig] = {
    # Index-Q RoPE + fp8 quantization (ops/indexer_q): 16 heads x 128 per program.
    "indexer_q.rope_quant": LaunchConfig(num_warps=4, num_stages=1, constexprs=(("BLOCK_H", 16),)),
    # Inverse RoPE (+ optional fp8) on the o_proj path (ops/inv_rope): two 512-wide heads
    # per program, one 16-byte bf16 vector per thread.
    "inv_rope.fused": LaunchConfig(num_warps=4, num_stages=1, constexprs=(("BLOCK_H", 2),)),
    # Cache writers (ops/cache_writers). The indexer K writer runs ONE warp: the warp
    # count fixes the norm's summation order, which must equal vLLM's for equal bytes.
    "cache_writers.indexer_k": LaunchConfig(num_warps=1, num_stages=1),
    "cache_writers.compressed_kv": LaunchConfig(num_warps=4, num_stages=1),
    "cache_writers.plain_rows": LaunchConfig(num_warps=4, num_stages=1),
    # Indexer scoring (ops/indexer_logits), keys-major dots: prefill stacks query rows to
    # 128 (row, head) pairs per program; decode takes the wide config when next_n x
    # heads > 32. Warps by measurement on an H200 (prefill 4 warps 1.2-1.4x
    # faster than 8; decode 2 warps for 32 pairs, 4 for 64 and 128; BLOCK_N 64 and 2
    # stages best or within 2% everywhere except next_n 2 x 32 heads, where BLOCK_N 128
    # or 3 stages were 7-9% faster; NVIDIA_H200.indexer_logits_variants.log), within
    # sm80/sm86 fit (<= 48 KB, no spill); unmeasured on an Ampere GPU.
    "indexer_logits.prefill": LaunchConfig(
        num_warps=4, num_stages=2, constexprs=(("BLOCK_N", 64), ("STACK", 128))
    ),
    "indexer_logits.decode": LaunchConfig(num_warps=2, num_stages=2, constexprs=(("BLOCK_N", 64),)),
    "indexer_logits.decode_wide": LaunchConfig(
        num_warps=4, num_stages=2, constexprs=(("BLOCK_N", 64),)
    ),
    # Engram lookup (ops/engram): one 256-column row per program iteration.
    "engram.lookup": LaunchConfig(num_warps=4, num_stages=1),
    # Programs loop over tiles of ROWS records (7 x 64 e4m3 + 64 bf16 each). Picked by
    # benchmarks/kv_cache_tune_gather.py on an H200 (48K rows: 2,869 GB/s vs 2,644 at 4 warps);
    # measured again with the current kernel: (4 rows, 1 warp) equal at 48K rows, 1%
    # faster at 512K, 2% faster to 5% slower at 16K across runs: kept. Unmeasured on an
    # Ampere GPU.
    "kv_cache.gather": LaunchConfig(num_warps=2, num_stages=1, constexprs=(("ROWS", 8),)),
    # One program per token; 4 warps cover the 512 + 128 row in two passes.
    "kv_cache.insert": LaunchConfig(num_warps=4, num_stages=1),
    # One CTA per query token writes its whole row (Top-K, SWA, -1 tail).
    "topk_swa.combine": LaunchConfig(num_warps=4, num_stages=1),
    "topk_swa.global_topk": LaunchConfig(num_warps=4, num_stages=1),
    # Sparse MLA: BLOCK_H heads x BLOCK_N rows x 512 per step. A token's rows are split
    # every ROWS_PER_SPLIT rows (batch-invariant: depends on the token alone). The
    # original's BLOCK_N=64 / 4 warps / 2 stages needs 131 KB of shared memory here.
    # Fitting configs (sm80/sm86: <= 48 KB, no spill, 2 CTAs/SM) were timed on an H200
    # as a proxy (benchmarks/results/NVIDIA_H200.tune_sparse_mla.log): 4 warps beat 8
    # (8 warps need maxnreg=128 for 2 CTAs/SM and then spill), and 128 rows per split
    # is the best compromise between T=1 (more CTAs) and T=256 (fewer partials).
    # PREFETCH (the hand-pipelined loop) fits Ampere only for bf16 prefill rows; with
    # the fp8 decode it spills 8-72 B on sm_80 at 255 registers, so decode runs unpipelined.
    "sparse_mla.decode": LaunchConfig(
        num_warps=4,
        num_stages=1,
        constexprs=(("BLOCK_H", 16), ("BLOCK_N", 16), ("ROWS_PER_SPLIT", 128), ("PREFETCH", 0)),
    ),
    # The TileLang decode (ops/sparse_mla/attention_sm80.cuh): 8 warps, a fixed tile of 16
    # heads x 16 rows (BLOCK_H/BLOCK_N state it; launch() refuses other values). With 8
    # heads per rank or fewer its narrow kernel runs instead (8 heads x 32 rows, fixed in
    # tilelang_kernels.py; same split policy, PREFETCH 1). Knobs:
    # ROWS_PER_SPLIT (a token's split count is ceil(rows / ROWS_PER_SPLIT); the kernel
    # deals the rows evenly over them, in whole 16-row steps) and PREFETCH (tiles of loads
    # in flight: 1 or 2; 2 measured no faster on the H200). sm_80/sm_86: 124-125
    # registers, 33.4 KB (narrow: 122, 46.1 KB) shared memory. ROWS_PER_SPLIT 192 (640 rows:
    # 4 splits of 160), measured on the H200 with the even split, wide kernel
    # (NVIDIA_H200.decode_tilelang_skewed_loop_and_fold_table.log). Against 128: 3-5%
    # slower at T<=4, 7-25% faster at T=64 and 256, at T=16 12-24% faster with 32 or 64
    # heads and 4% slower with 8; DSpark T=5 20% slower, T=80 13% faster. Against 224:
    # 9-16% faster at T<=16, 6-9% slower at T=256. DSpark (K=5) decodes 6 tokens per
    # request, so T>=16 from 3 requests on.
    # THROUGHPUT_ROWS_PER_SPLIT: the split size when the deployment asks for throughput
    # (DEEPINFER_SPARSE_MLA_DECODE_SPLITS=throughput): a V4.1 token's 128 + 512 rows in
    # one split, no partials, no merge (wide kernel 47.4 KB, narrow 40.2 KB through its
    # register path for PV). H200, T=256: 207/108/42 us against 292/154/56 with 64/32/8
    # heads; T<=16 about 2x slower (NVIDIA_H200.decode_tilelang_one_split_per_token.log).
    # SPLITS_FASTEST (0 or 1): the launch grid's order (AttentionVariant.splits_fastest). 0:
    # grid (tokens, head blocks, splits), token fastest; 1: a 1-D grid with the split
    # fastest, so a token's splits run side by side and the last to arrive merges partials
    # still in L2. On an H100 the two give the same bits; 1 is 7% faster at T=256 with
    # latency splits and up to 4.7% slower on small grids (benchmarks/sparse_mla_ab_grid_order.py,
    # NVIDIA_H100.ab_decode_grid_order.txt), so 0 ships.
    # HEAD_TILES (1, 2 or 4): with more than 8 heads per rank, 1 runs the wide kernel (16
    # heads per CTA); 2 or 4 run the narrow kernel with that many n-tiles of 8 heads per
    # CTA (AttentionVariant.head_tiles: each row loaded and decoded once for 16 or 32
    # heads; one CTA per SM, 230 registers and 56-67 KB of opt-in shared memory at 32
    # heads on sm_80/86). On an H100 it is slower than the wide kernel at 32 and 64 heads
    # in both split modes (HEAD_TILES 4: 0.63-0.90x; 2: 0.71-1.08x): one CTA per SM leaves
    # 8 warps to hide each tile's latency, and ncu at T=256, 64 heads shows 22% fewer
    # instructions issued at 1.30 instead of 1.90 per cycle
    # (NVIDIA_H100.ab_decode_head_tiles.txt, NVIDIA_H100.ncu_decode_T256_H64_throughput_*.txt).
    # 1 ships. No Ampere GPU has run it: an A100 owner can time it with that benchmark.
    # QK_REGISTERS (0 or 1): the wide kernel's NoPE warps feed QK's B fragments from their
    # decoded registers instead of ldmatrix from their slices (AttentionVariant.qk_registers):
    # 5 instead of 9 ldmatrix per NoPE warp and tile; 128 registers, no spills on sm_80/86.
    # On an H100 it is 0.94-1.00x the wide kernel at 16 to 64 heads in both split modes:
    # L1/TEX throughput falls (77.5% to 67.4% at T=256, 64 heads) but the instructions per
    # HMMA rise (16.5 to 17.8), and the kernel is latency-bound, not L1-bound: 3.8 warps
    # per scheduler, 0.47 issued per cycle, stalls on fixed-latency dependencies and
    # shared-memory results (NVIDIA_H100.ab_decode_qk_registers.txt,
    # NVIDIA_H100.ncu_decode_qk_registers.txt). 0 ships (the shipped cubins are those
    # without the option).
    # CTAS_PER_SM (2 or 3): the wide kernel's minimum CTAs per SM as ptxas is told
    # (AttentionVariant.ctas_per_sm). 3 gives 12 warps per SM instead of 8 for that latency,
    # at 80 registers and 3 x 48 KB of shared memory, which sm_80 has (164 KB per SM) and
    # sm_86 does not (100 KB). ptxas spills 60-76 B per thread there, which the fit check
    # refuses on both (it ships no spilling kernel), so 3 is a measurement:
    # `benchmarks/sparse_mla_ab_head_tiles.py --candidate ctas-3` times it at 0.52-0.80x
    # the wide kernel on an H100 (NVIDIA_H100.ab_decode_ctas3.txt). 2 ships.
    "sparse_mla.decode_tilelang": LaunchConfig(
        num_warps=8,
        num_stages=1,
        constexprs=(
            ("BLOCK_H", 16),
            ("BLOCK_N", 16),
            ("ROWS_PER_SPLIT", 192),
            ("PREFETCH", 1),
            ("THROUGHPUT_ROWS_PER_SPLIT", 640),
            ("SPLITS_FASTEST", 0),
            ("HEAD_TILES", 1),
            ("QK_REGISTERS", 0),
            ("CTAS_PER_SM", 2),
        ),
    ),
    # The Triton prefill (where TileLang cannot run or DEEPINFER_SPARSE_MLA_PREFILL=triton).
    # On GPUs the prefill runs the TileLang wide kernel over bf16 rows instead
    # (tilelang_kernels.prefill_variant: the decode tile, one split per token, no knobs).
    "sparse_mla.prefill": LaunchConfig(
        num_warps=4,
        num_stages=1,
        constexprs=(("BLOCK_H", 16), ("BLOCK_N", 16), ("PREFETCH", 1)),
    ),
    # The split reduction of the Triton decode (the TileLang decode merges its splits in
    # the kernel): 4 heads per program (H200,
    # NVIDIA_H200.sparse_mla_reduce_block_h.log, measured with the TileLang decode of the
    # time): 1-2 us faster than 16 heads at every T (more, smaller programs hide the loads
    # of the splits' partials better).
    "sparse_mla.reduce": LaunchConfig(num_warps=4, num_stages=1, constexprs=(("BLOCK_H", 4),)),
}


def kernel_config(name: str) -> LaunchConfig:
    """The shipped config for ``name``; a missing name is a programming error."""
    try:
        return KERNEL_CONFIGS[name]
    except KeyError:
        raise KeyError(
            f"no shipped launch config named {name!r}; known: {sorted(KERNEL_CONFIGS)}"
        ) from None


def ptxas_arch(cc: int) -> str:
    """ptxas/nvcc's name for ``cc``: sm_80, sm_86; sm_90a for Hopper, the arch-specific
    target that Triton's and TileLang's PTX for a 9.0 device declares."""
    return f"sm_{cc}a" if cc == HOPPER_PROXY_CC else f"sm_{cc}"


def parse_ampere_arches(text: str, hopper_proxy: bool = False) -> list[int]:
    """``--arches "8.0 8.6"`` (spaces or commas) -> ``[80, 86]``; anything else is an
    error, except 9.0 with ``hopper_proxy``."""
    ccs = []
    for item in text.replace(",", " ").split():
        major, _, minor = item.partition(".")
        cc = int(major) * 10 + int(minor) if major.isdigit() and minor.isdigit() else None
        if cc == HOPPER_PROXY_CC and hopper_proxy:
            ccs.append(cc)
            continue
        if cc not in AMPERE_CCS:
            hint = "" if hopper_proxy else " (9.0 with --hopper-proxy)"
            raise ValueError(
                f"--arches: {item!r} is not an Ampere compute capability; use 8.0 and/or 8.6{hint}"
            )
        ccs.append(cc)
    if not ccs:
        raise ValueError('--arches: empty; use "8.0 8.6"')
    return ccs
