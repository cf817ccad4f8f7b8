"""The shipped launch config of a kernel and what compiling it for Ampere measured.

``KernelSpec`` is what each op's ``ampere_kernel_specs()`` returns and what the AOT build
(``aot.py``) and the Ampere fitness check (``ampere_fit.py``) compile; ``FitReport`` is
the registers, spills and shared memory one compile measured (Triton and TileLang
kernels alike). Plain data: importing it needs neither Triton nor a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KernelSpec:
    """A kernel config as it ships.

    Args:
        label: name shown in reports, e.g. ``"kv_cache.gather"``.
        kernel: ``"package.module:attr"`` (dots allowed after the colon) of the kernel.
        signature: argument name -> Triton type (``"*u8"``, ``"*bf16"``, ``"i32"``,
            ``"i64"``...); constexpr arguments go in ``constexprs`` instead.
        constexprs: constexpr argument values.
        num_warps, num_stages, maxnreg: launch parameters (``maxnreg`` caps registers
            per thread, e.g. so two CTAs fit one SM).
        min_ctas_per_sm: CTAs that must fit one SM by registers (the 48 KB shared-memory
            cap already leaves room for two on sm86's 99 KB).
        aligned_pointers: compile as if every pointer is 16-byte aligned, the case
            Triton specializes for at run time (wider vector loads, more registers).
        ints_divisible_by_16: integer arguments that are multiples of 16 in production
            (strides, page sizes); Triton specializes those at run time too, and the
            vectorization -- hence registers -- depends on it. Integer arguments equal to
            1 at run time (unit strides) belong in ``constexprs`` as 1, as Triton does.
    """

    label: str
    kernel: str
    signature: dict[str, str]
    constexprs: dict[str, int | bool] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 1
    aligned_pointers: bool = True
    ints_divisible_by_16: tuple[str, ...] = ()
    maxnreg: int | None = None
    min_ctas_per_sm: int = 1


@dataclass(frozen=True)
class FitReport:
    label: str
    arch: str
    shared_bytes: int | None
    registers: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    error: str | None = None
    threads: int = 0
    min_ctas_per_sm: int = 1
