"""Shapes and the split geometry of the mHC kernels, in one place.

The prenorm GEMM reduces over the ``hc * hidden`` stream. It is split along the hidden
dimension into ``N_SPLITS`` slices of ``hidden // N_SPLITS`` elements (all ``hc`` streams
of those hidden positions): for DeepSeek-V4.1 (hidden 5,120) that is eight slices of 640,
each a multiple of 128, the geometry of vLLM's fused kernel (tile 6, 8 splits, 128
threads), and every token count uses them. The Tensor Core path computes each slice as
five 128-wide blocks (one CTA each, so 16 tokens already fill 40 CTAs); its 40 partial
rows are slice-major (``slice * 5 + block``). The epilogue adds the partial rows of a
token in row order, so the reduction order is fixed and depends on the token's own path,
never on the batch around it.

Token counts pick a path (``choose_path``): below ``TC_MIN_TOKENS`` a fused CUDA-core
kernel whose CTAs each hold a group of up to 4 tokens for one (mix tile, slice), so the
weights are read once per group; from ``TC_MIN_TOKENS`` on a Tensor Core kernel (TF32
``mma.sync`` on Ampere, fp32 accumulation). Both fold the post mixing into the GEMM's
operand load. Within each path a token's outputs are bit-identical whatever the batch
(tested); a token run at 15 tokens and at 16 takes different paths.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer_sm80.arch import LaunchConfig

HC_MULT = 4
HIDDEN = 5120
N_SPLITS = 8
SINKHORN_ITERS = 20


# Token counts below this take the CUDA-core kernel; the rest take T.gemm.
TC_MIN_TOKENS = 16
# Elements of the hidden dimension each thread of the small kernel owns (one 8-byte
# bf16 load per stream): 160 threads cover a 640-wide slice.
SMALL_VEC = 4
# The Tensor Core kernel cuts each 640-wide slice into 5 blocks of 128 (one CTA each), so
# 16 tokens already give 40 CTAs; the epilogue adds the 40 partial rows in order.
TC_SUB_BLOCKS = 5

# The shipped configs, as data.
# small: "token_group" tokens per CTA (grid = 24 / tile_n x 8 slices x groups); every
# token of a group is computed, a partial last group never stores its spare tokens.
# "tile_n" mix rows per CTA. One token takes a 1-token group over 24 one-row tiles (192
# CTAs); from 3 tokens on, groups of 3 over 6 four-row tiles (48 CTAs a group). Timed on
# an H200 (no Ampere measurement) with benchmarks/mhc_tune_small.py, whole op, cold L2:
# groups of 3 x 4 rows beat groups of 4 x 2 rows at every T from 3 to 15
# (T=12 15.14 vs 15.94 us, T=15 14.85 vs 15.71 us, same bits; hoisted: T=12 13.8 us).
# Groups of 4 had taken T=12 from 20.6 us (one CTA holding all 12 tokens) to 15.7 us. On
# sm_80 the groups of 3 use 157 registers (two CTAs per SM; 192 CTAs at T=12 fit one wave
# on an A100).
# "hoist_loads": the weights and the group's x and residual load before the coefficients'
# barrier, not behind it (a second memory round trip). On the H200 it took T=1 from 12.4
# to 10.8 us; for groups of 4 x 2 rows it had cost a CTA per SM (T=12 kernel 5.9 -> 7.4
# us); groups of 3 x 4 rows hoisted use 157 registers on sm_80 instead of 156 and were
# faster at every T measured (T=12 13.76 vs 14.08 us in one run).
# num_warps = 640 / 4 / 32 = 5.
LAUNCH_CONFIGS: dict[str, LaunchConfig] = {
    "mhc.small.g1": LaunchConfig(
        num_warps=5, constexprs=(("token_group", 1), ("tile_n", 1), ("hoist_loads", 1))
    ),
    "mhc.small.g2": LaunchConfig(
        num_warps=5, constexprs=(("token_group", 2), ("tile_n", 1), ("hoist_loads", 1))
    ),
    "mhc.small.g3": LaunchConfig(
        num_warps=5, constexprs=(("token_group", 3), ("tile_n", 4), ("hoist_loads", 1))
    ),
    # tc: "block_m" tokens x "block_h" hidden positions (x 4 streams = the GEMM's K step)
    # per pipeline stage; 4 warps, one per 8 columns of a 32-wide B tile (24 mix rows
    # loaded), TF32 m16n8k8. One tile for every token count >= 16, so a token's sums never
    # depend on the batch. Shared memory: 3 x (2 + 0.5 + 8) KiB stages + 4 KiB A tile +
    # coefficients = 37,888 B. Stage loads are written as 16-byte vectors so TileLang emits
    # 16-byte cp.async (T.copy chose 4-byte ones: 1024 tokens took 135 us, now 116 us).
    "mhc.tc": LaunchConfig(
        num_warps=4,
        num_stages=3,
        constexprs=(("block_m", 16), ("block_h", 16), ("sub_blocks", TC_SUB_BLOCKS)),
    ),
    # Epilogue: warp 0 for the coefficients + 4 warps x 8 bf16 over a 1,024 chunk.
    "mhc.epilogue": LaunchConfig(num_warps=5),
    # Post + sum of squares: one CTA per token, 8 warps x 4 elements x 5 passes.
    "mhc.post_sqrsum": LaunchConfig(num_warps=8),
}
SMALL_TOKEN_GROUPS = tuple(
    sorted(
        dict(cfg.constexprs)["token_group"]
        for name, cfg in LAUNCH_CONFIGS.items()
        if name.startswith("mhc.small.")
    )
)


def mix_size(hc_mult: int) -> int:
    return hc_mult * (hc_mult + 2)


def slice_width(hidden: int) -> int:
    return hidden // N_SPLITS


@dataclass(frozen=True)
class SmallConfig:
    """CUDA-core fused kernel: every token of the launch in each CTA."""

    token_group: int  # tokens per CTA; grid = (mix // tile_n, N_SPLITS, groups)
    tile_n: int  # mix rows per CTA
    hoist_loads: bool  # load weights, x and residual before the coefficients' barrier


@dataclass(frozen=True)
class TensorCoreConfig:
    """T.gemm fused kernel: ``block_m`` tokens x one slice per CTA."""

    block_m: int
    block_h: int  # hidden positions per pipeline step (x hc streams = the GEMM's K step)
    num_stages: int
    threads: int
    sub_blocks: int  # CTAs per slice; partial rows = N_SPLITS * sub_blocks


def small_config(num_tokens: int) -> SmallConfig:
    if not 0 < num_tokens < TC_MIN_TOKENS:
        raise ValueError(f"num_tokens={num_tokens} is not a small-kernel token count")
    group = 1 if num_tokens == 1 else 2 if num_tokens == 2 else 3
    c = dict(LAUNCH_CONFIGS[f"mhc.small.g{group}"].constexprs)
    return SmallConfig(token_group=group, tile_n=c["tile_n"], hoist_loads=bool(c["hoist_loads"]))


def tensor_core_config(num_tokens: int) -> TensorCoreConfig:
    del num_tokens  # one tile for all: batch invariance
    cfg = LAUNCH_CONFIGS["mhc.tc"]
    c = dict(cfg.constexprs)
    return TensorCoreConfig(
        block_m=c["block_m"],
        block_h=c["block_h"],
        num_stages=cfg.num_stages,
        threads=32 * cfg.num_warps,
        sub_blocks=c["sub_blocks"],
    )


def choose_path(num_tokens: int) -> str:
    return "small" if num_tokens < TC_MIN_TOKENS else "tensor_core"


def check_supported_shape(hidden: int, hc_mult: int) -> None:
    """The kernels tile the hidden dimension in fixed steps; say which shapes work."""
    sw = hidden // N_SPLITS
    problems = []
    if hidden % N_SPLITS:
        problems.append(f"hidden_size={hidden} is not a multiple of {N_SPLITS} slices")
    elif sw % 128:
        problems.append(f"a slice of {sw} elements is not a multiple of 128")
    elif sw % (TC_SUB_BLOCKS * 16):
        problems.append(f"a slice of {sw} elements does not split into {TC_SUB_BLOCKS} x 16")
    if hidden % 1024:
        problems.append(f"hidden_size={hidden} is not a multiple of 1024 (epilogue chunk)")
    if hc_mult != HC_MULT:
        problems.append(f"hc_mult={hc_mult} (the kernels are built for hc_mult={HC_MULT})")
    if problems:
        raise ValueError(
            "mHC kernels: unsupported shape: "
            + "; ".join(problems)
            + ". Use vLLM's stock TileLang path for this model."
        )
