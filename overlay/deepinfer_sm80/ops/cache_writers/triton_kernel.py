"""Shared pieces of the cache-writer kernels: conversions, launch configs, Ampere specs.

vLLM 0.33.0's writers round fp32 to e4m3 with ``tl.float8e4nv`` (refused below sm_89)
and to bf16 with the hardware ``cvt.rn.bf16.f32``. Ours do both in software with
integer and fp32 operations only, so they compile for sm_80/sm_86 and give the same
bytes under ``TRITON_INTERPRET=1`` as on a GPU (the interpreter's own fp32->bf16 cast
truncates and its fp32->fp8 cast rounds ties up; see README.md).

Everything else a writer computes (norm, RoPE, the UE8M0 exponent) is kept operation
for operation as vLLM's kernels write it: on a GPU the same Triton ops lower to the
same instructions (libdevice ``log2f``, ``rsqrt.approx``, FMA contraction), which is
what makes the bytes equal vLLM's there and not merely close.

The kernels live in ``indexer_k.py`` and ``compressed_kv.py``; this module lists the
configs they ship (``arch.KERNEL_CONFIGS["cache_writers.*"]``) and their Ampere fitness specs.
"""

import triton
import triton.language as tl

from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops.fp8.triton_fp8 import f32_to_e4m3

# One program per token in every writer. The indexer's warp count is part of its
# numerics, not a tuning knob: its RMSNorm sums 128 squares in fp32, and the summation
# tree (hence the last bit) follows the register layout, which follows num_warps.
# vLLM launches its indexer writer with 1 warp; so must we, or the bytes drift.


@triton.jit
def _bf16_rne_bits32(x):
    """fp32 -> its round-to-nearest-even bf16 value, as fp32 bits (low half zero).

    Adding 0x7FFF plus the kept LSB to the raw bits rounds the dropped 16 bits to
    nearest, ties to even, carrying into the exponent (up to inf) when needed; it is
    exact for subnormals, infinities and signed zeros alike. NaN becomes 0x7FFF, the
    canonical NaN ``cvt.rn.bf16.f32`` writes (and adding to a NaN's bits could wrap).
    """
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(x == x, bits, 0x7FFF0000)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536


@triton.jit
def bf16_rne(x):
    """fp32 rounded to bf16 (RNE) and widened back: vLLM's ``.to(bf16).to(fp32)``."""
    return _bf16_rne_bits32(x).to(tl.float32, bitcast=True)


@triton.jit
def bf16_rne_bits(x):
    """fp32 -> bf16 bit pattern (int16), RNE; store through an int16 pointer."""
    return (_bf16_rne_bits32(x) >> 16).to(tl.int16)


@triton.jit
def ue8m0_exponent(group_amax):
    """Power-of-two exponent of a group's scale: ceil(log2(max(amax, 1e-4) / 448)).

    Written as vLLM writes it -- NaN-ignoring maximum with the floor, times the fp32
    constant 1/448, libdevice log2f, ceil -- so the compiled instructions, hence the
    results, are vLLM's for every input, inf included. For finite bf16 group values it
    is also the exact ceil(log2(amax / 448)) (tested over every bf16 value).
    """
    return tl.ceil(tl.log2(tl.maximum(group_amax, 1e-4) * (1.0 / 448.0)))


@triton.jit
def e4m3_saturated(scaled):
    """fp32 -> e4m3fn byte (int32) as vLLM's clamp-then-convert writes it on a GPU.

    ``f32_to_e4m3`` rounds to nearest even and saturates at +-448, which is vLLM's
    ``clamp(x, -448, 448)`` followed by ``cvt.rn.satfinite.e4m3x2``. The clamp lowers
    to ``min.xorsign.abs`` (sm_86+), whose NaN input yields the other operand: NaN is
    stored as +448 (0x7E), never as an e4m3 NaN.
    """
    return f32_to_e4m3(tl.where(scaled == scaled, scaled, 448.0))


_INDEXER = "deepinfer_sm80.ops.cache_writers.indexer_k:indexer_k_fp8_store_kernel"
_V4 = "deepinfer_sm80.ops.cache_writers.compressed_kv:compressed_kv_v4_record_kernel"
_PLAIN = "deepinfer_sm80.ops.cache_writers.compressed_kv:compressed_kv_plain_row_kernel"


def ampere_kernel_specs() -> list[KernelSpec]:
    """The configs this op ships, for the sm80/sm86 fitness tier.

    Block sizes and page strides are runtime arguments, so one compile per compress
    ratio (1, 2) covers every cache geometry. Specialized as vLLM launches them: bf16
    rows, fp32 cos/sin cache, int64 positions and slots, bf16 norm weight, aligned
    pointers, strides and block sizes multiples of 16.
    """
    specs = []
    idx = kernel_config("cache_writers.indexer_k")
    v4 = kernel_config("cache_writers.compressed_kv")
    plain = kernel_config("cache_writers.plain_rows")
    for ratio in (1, 2):
        specs.append(
            KernelSpec.from_jit(
                f"cache_writers.indexer_k[cr={ratio}]",
                _INDEXER,
                pointers={
                    "k_pre_ptr": "*bf16",
                    "positions_ptr": "*i64",
                    "weight_ptr": "*bf16",
                    "cos_sin_ptr": "*fp32",
                    "cache_ptr": "*u8",
                    "slot_mapping_ptr": "*i64",
                },
                scalars={"eps": "fp32"},
                constexprs={"COMPRESS_RATIO": ratio},
                num_warps=idx.num_warps,
                num_stages=idx.num_stages,
                ints_divisible_by_16=(
                    "k_pre_stride",
                    "cos_sin_stride",
                    "page_stride",
                    "block_size",
                ),
            )
        )
        specs.append(
            KernelSpec.from_jit(
                f"cache_writers.compressed_kv[cr={ratio}]",
                _V4,
                pointers={
                    "latent_ptr": "*bf16",
                    "positions_ptr": "*i64",
                    "cos_sin_ptr": "*fp32",
                    "cache_ptr": "*u8",
                    "slot_mapping_ptr": "*i64",
                },
                constexprs={"COMPRESS_RATIO": ratio},
                num_warps=v4.num_warps,
                num_stages=v4.num_stages,
                ints_divisible_by_16=(
                    "latent_stride",
                    "cos_sin_stride",
                    "page_stride",
                    "block_size",
                ),
            )
        )
        for store_fp8 in (False, True):
            specs.append(
                KernelSpec.from_jit(
                    f"cache_writers.plain_rows[cr={ratio},fp8={int(store_fp8)}]",
                    _PLAIN,
                    pointers={
                        "latent_ptr": "*bf16",
                        "positions_ptr": "*i64",
                        "cos_sin_ptr": "*fp32",
                        "cache_ptr": "*u8" if store_fp8 else "*i16",
                        "slot_mapping_ptr": "*i64",
                        "fp8_scale_ptr": "*fp32",
                    },
                    constexprs={"COMPRESS_RATIO": ratio, "STORE_FP8": store_fp8},
                    num_warps=plain.num_warps,
                    num_stages=plain.num_stages,
                    ints_divisible_by_16=(
                        "latent_stride",
                        "cos_sin_stride",
                        "page_stride",
                        "row_stride",
                        "block_size",
                    ),
                )
            )
    return specs


__all__ = [
    "ampere_kernel_specs",
    "bf16_rne",
    "bf16_rne_bits",
    "e4m3_saturated",
    "ue8m0_exponent",
]
