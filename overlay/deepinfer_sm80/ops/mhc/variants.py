"""Kernel variants of the mHC op: which builder is compiled, with which parameters.

A ``KernelVariant`` names one of the builders in ``tilelang_kernels`` and its compile-time
parameters; ``deepinfer_sm80.tilelang_build.get_kernel`` compiles it (through TileLang's
cache, with the backend and the common pass configs pinned there). ``warmup.py`` lists
the shipped ones, which ``python -m deepinfer_sm80.aot build`` compiles ahead of time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepinfer_sm80.tilelang_build import ampere_pass_configs

# Builders: name -> function in tilelang_kernels.
KINDS = ("post_prenorm_small", "post_prenorm_tc", "mix_norm_epilogue", "post_sqrsum")


@dataclass(frozen=True)
class KernelVariant:
    """One compiled kernel: a builder name and its keyword parameters (sorted)."""

    kind: str
    params: tuple[tuple[str, Any], ...]

    @classmethod
    def make(cls, kind: str, **params: Any) -> KernelVariant:
        if kind not in KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {KINDS}")
        return cls(kind, tuple(sorted(params.items())))

    @property
    def label(self) -> str:
        short = {
            "post_prenorm_small": "small",
            "post_prenorm_tc": "tc",
            "mix_norm_epilogue": "epilogue",
            "post_sqrsum": "post_sqrsum",
        }[self.kind]
        keep = {
            "token_group": "g",
            "tile_n": "n",
            "block_m": "bm",
            "block_h": "bh",
            "num_stages": "st",
            "sub_blocks": "sub",
            "n_part": "parts",
            "hoist_loads": "h",
        }
        parts = []
        for name, value in self.params:
            if name in keep:
                v = int(value) if isinstance(value, bool) else value
                parts.append(f"{keep[name]}{v}")
        return f"mhc.{short}[{','.join(parts)}]"

    def threads(self) -> int:
        """Threads per CTA of this variant (for the register budget)."""
        from deepinfer_sm80.ops.mhc import tilelang_kernels as kernels
        from deepinfer_sm80.ops.mhc.geometry import SMALL_VEC, slice_width

        p = dict(self.params)
        if self.kind == "post_prenorm_small":
            return slice_width(p["hidden"]) // SMALL_VEC
        if self.kind == "post_prenorm_tc":
            return p["threads"]
        if self.kind == "mix_norm_epilogue":
            return 32 + kernels.EPILOGUE_CHUNK // kernels.EPILOGUE_VEC
        return kernels.POST_SQRSUM_THREADS

    def build(self):
        """The TileLang PrimFunc."""
        from deepinfer_sm80.ops.mhc import tilelang_kernels

        return getattr(tilelang_kernels, self.kind)(**dict(self.params))

    def pass_configs(self) -> dict:
        import tilelang

        configs = ampere_pass_configs()
        if self.kind == "post_sqrsum":
            # Each product and sum rounds on its own, so PyTorch can reproduce the bits.
            configs[tilelang.PassConfigKey.TL_DEVICE_COMPILE_FLAGS] = ["--fmad=false"]
        return configs
