"""Argument checks shared by the ops' host wrappers.

Every failure is a ``ValueError`` that names the argument, what was expected and
what arrived, so a caller can fix the call without reading the kernel.
"""

import torch


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    ndim: int | tuple[int, ...] | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            want = " or ".join(str(d) for d in allowed)
            raise ValueError(f"{name}: expected dtype {want}, got {t.dtype}")
    if ndim is not None:
        allowed_nd = ndim if isinstance(ndim, tuple) else (ndim,)
        if t.dim() not in allowed_nd:
            raise ValueError(
                f"{name}: expected {' or '.join(map(str, allowed_nd))} dimensions, "
                f"got shape {tuple(t.shape)}"
            )
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like the others), got {t.device}")
    return t


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_rows(name: str, t: torch.Tensor, rows: int, what: str) -> None:
    if t.shape[0] != rows:
        raise ValueError(f"{name}: expected {rows} rows ({what}), got shape {tuple(t.shape)}")


def check_paged_records(
    name: str, cache: torch.Tensor, record_bytes: int, block_size: int | None = None
) -> None:
    """A paged record cache (``[pages, block_size, record_bytes]``, or ``[pages, page
    bytes]`` with ``block_size`` given) whose record width the caller has checked:
    bytes contiguous, and pages at least a page apart (vLLM pads the page stride,
    never shrinks it)."""
    block_size = cache.shape[1] if block_size is None else block_size
    if cache.stride(-1) != 1:
        raise ValueError(f"{name}: the byte dimension must be contiguous (stride 1)")
    if cache.stride(0) < block_size * record_bytes:
        raise ValueError(
            f"{name}: page stride {cache.stride(0)} B is smaller than block_size "
            f"{block_size} x {record_bytes} B; pass the page-strided cache vLLM allocates"
        )
