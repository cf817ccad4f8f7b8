"""What the TileLang sparse-MLA decode A/B benchmarks share: one of arch.py's
``sparse_mla.decode_tilelang`` knobs set for a block of calls, and the run's stack line."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

CONFIG = "sparse_mla.decode_tilelang"


@contextlib.contextmanager
def decode_constexpr(name: str, value: int) -> Iterator[None]:
    """arch.py's TileLang decode config with ``name`` set to ``value`` for the block's
    calls (launch() and warmup read it per call); restored afterwards."""
    from deepinfer_sm80 import arch

    base = arch.KERNEL_CONFIGS[CONFIG]
    if name not in base.constexpr_dict():
        raise KeyError(f"{CONFIG} has no constexpr {name!r}")
    consts = {**base.constexpr_dict(), name: value}
    arch.KERNEL_CONFIGS[CONFIG] = dataclasses.replace(base, constexprs=tuple(consts.items()))
    try:
        yield
    finally:
        arch.KERNEL_CONFIGS[CONFIG] = base


def stack_line(info: dict) -> str:
    """GPU and versions, as every A/B log's first line states them."""
    return (
        f"{info.get('gpu')} | torch {info['torch']} | triton {info['triton']} | "
        f"tilelang {info['tilelang']} | CUDA {info['cuda_runtime']} | driver {info.get('driver')}"
    )
