"""Which sparse MLA kernels run, and with how many splits: the engine and split policy.

The TileLang kernels (``tilelang_kernels.py`` over ``attention_sm80.cuh``) run where they
can, the Triton kernels (``triton_kernel.py``) elsewhere; ``DEEPINFER_SPARSE_MLA_DECODE``
and ``DEEPINFER_SPARSE_MLA_PREFILL`` force one. ``DEEPINFER_SPARSE_MLA_DECODE_SPLITS``
picks the decode split size (``decode_rows_per_split``). All three are read through the
registry in ``deepinfer_sm80.envs``.
"""

import importlib.util
import logging
import sys

import torch

from deepinfer_sm80 import envs
from deepinfer_sm80.arch import kernel_config
from deepinfer_sm80.envs import DECODE_SPLITS_ENV
from deepinfer_sm80.ops._triton_utils import INTERPRETING

DECODE_ENGINE_ENV = "DEEPINFER_SPARSE_MLA_DECODE"
PREFILL_ENGINE_ENV = "DEEPINFER_SPARSE_MLA_PREFILL"


def decode_split_mode() -> str:
    """``DEEPINFER_SPARSE_MLA_DECODE_SPLITS``: ``latency`` (default) or ``throughput``.
    A deployment setting, fixed for the server's life: a token's split count still depends
    only on its own rows, so outputs stay batch-invariant in either mode."""
    return envs.choice(DECODE_SPLITS_ENV)


def decode_config_name(engine: str) -> str:
    """The arch.py launch config of ``engine``'s decode kernels (``decode_engine``)."""
    return "sparse_mla.decode" if engine == "triton" else "sparse_mla.decode_tilelang"


def decode_rows_per_split(engine: str, heads: int, width: int) -> int:
    """Rows per split of a decode launch: arch.py's ``ROWS_PER_SPLIT``, or in throughput
    mode, for the TileLang kernels and index rows wider than that,
    ``THROUGHPUT_ROWS_PER_SPLIT``. Fewer splits cut each split's fixed cost (row
    resolution, partials, the merge) at large batches and lengthen a small batch's longest
    CTA. The Triton kernel (the fallback, and the interpreter's path) keeps
    ROWS_PER_SPLIT: the throughput split was measured for the TileLang kernels only, both
    of which fit a 640-row split in 48 KB. ``heads`` is for the warning."""
    cfg = kernel_config(decode_config_name(engine)).constexpr_dict()
    rps = cfg["ROWS_PER_SPLIT"]
    if decode_split_mode() == "latency" or width <= rps:
        return rps
    if engine != "tilelang":
        _warn_once(
            f"{DECODE_SPLITS_ENV}=throughput applies to the TileLang kernels; {heads} heads "
            f"on the {engine} kernel keep {rps} rows per split"
        )
        return rps
    return cfg["THROUGHPUT_ROWS_PER_SPLIT"]


def decode_engine(device: torch.device) -> str:
    """Which decode kernel runs: ``tilelang`` (``attention_sm80.cuh``, one warp per 64-dim
    scale group) where it can (a CUDA device of compute capability 8.0+, TileLang
    installed, no Triton interpreter), else ``triton`` (``triton_kernel.py``'s unified
    kernel).
    ``DEEPINFER_SPARSE_MLA_DECODE=triton|tilelang`` forces one; forcing ``tilelang``
    where it cannot run is refused with the reason."""
    return _engine(device, DECODE_ENGINE_ENV, "decode")


def prefill_engine(device: torch.device) -> str:
    """The same choice for prefill (``DEEPINFER_SPARSE_MLA_PREFILL``): ``tilelang`` runs
    ``attention_sm80.cuh``'s kernels over the bf16 rows, ``triton`` ``triton_kernel.py``'s."""
    return _engine(device, PREFILL_ENGINE_ENV, "prefill")


def _engine(device: torch.device, env: str, what: str) -> str:
    choice = envs.choice(env)
    if choice == "triton":
        return choice
    why_not = _tilelang_unusable(device)
    if why_not is None:
        return "tilelang"
    if choice == "tilelang":
        raise ValueError(f"{env}=tilelang: {why_not}; unset it or choose triton")
    if device.type == "cuda" and not INTERPRETING:  # auto fell back on a GPU: say so once
        _warn_once(f"sparse MLA {what} runs the Triton kernel: {why_not}")
    return "triton"


def _tilelang_unusable(device: torch.device) -> str | None:
    """Why the TileLang kernels cannot run on ``device`` (None = they can)."""
    if device.type != "cuda" or INTERPRETING:
        return f"it needs a CUDA device without TRITON_INTERPRET (got {device})"
    if "tilelang" not in sys.modules and importlib.util.find_spec("tilelang") is None:
        return "TileLang is not installed (pip install tilelang==0.1.12, as vLLM 0.33.0 pins)"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"it needs compute capability 8.0 or newer (this GPU is {major}.{minor})"
    return None


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logging.getLogger("deepinfer_sm80.sparse_mla").warning(message)
