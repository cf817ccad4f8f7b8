"""Kernel variants of the mHC op: what is compiled, for which target, and the compiled cache.

A ``KernelVariant`` names one of the builders in ``tilelang_kernels`` and its compile-time
parameters. ``get_kernel`` compiles it through TileLang's own cache (memory, then disk
under ``TILELANG_CACHE_DIR``, then nvcc), so a kernel compiled ahead of time for
``sm_80``/``sm_86`` (``warmup.py``) is found on disk by a server on that architecture: the
disk key is a hash of the kernel's TIR, the target, the execution backend and the pass
configs, and all four are pinned here so the AOT build and the server agree.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

# Pinned so that a kernel compiled ahead of time and the one the server asks for share a
# cache key: TileLang's "auto" backend could resolve differently on the two machines.
EXECUTION_BACKEND = "tvm_ffi"
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

        key = tilelang.PassConfigKey
        configs: dict = {
            # Hopper-only lowerings stay off so an H200 (our only GPU) runs the same kind of
            # code as Ampere; on sm_80/sm_86 they are inert.
            key.TL_DISABLE_WARP_SPECIALIZED: True,
            key.TL_DISABLE_TMA_LOWER: True,
        }
        if self.kind == "post_sqrsum":
            # Each product and sum rounds on its own, so PyTorch can reproduce the bits.
            configs[key.TL_DEVICE_COMPILE_FLAGS] = ["--fmad=false"]
        return configs


def cuda_target(cc: int) -> dict:
    """TileLang target for compute capability ``cc`` (80 -> sm_80), as its detector builds it."""
    return {"kind": "cuda", "arch": f"sm_{cc}"}


_lock = threading.Lock()
_compiled: dict[tuple[KernelVariant, str], Any] = {}


def get_kernel(variant: KernelVariant, target: dict | str = "auto"):
    """The compiled JITKernel for ``variant`` (compiled once per process and target)."""
    key = (variant, repr(target))
    kernel = _compiled.get(key)
    if kernel is not None:
        return kernel
    import tilelang

    with _lock:
        kernel = _compiled.get(key)
        if kernel is None:
            kernel = tilelang.compile(
                variant.build(),
                target=target,
                execution_backend=EXECUTION_BACKEND,
                pass_configs=variant.pass_configs(),
            )
            _compiled[key] = kernel
    return kernel


def forget_compiled() -> None:
    """Drop this module's compiled kernels (tests use it to force a cache lookup)."""
    with _lock:
        _compiled.clear()
