"""The shipped launch config of a kernel and what compiling it for Ampere measured.

``KernelSpec`` is what each op's ``ampere_kernel_specs()`` returns and what the AOT build
(``aot.py``) and the Ampere fitness check (``ampere_fit.py``) compile; ``FitReport`` is
the registers, spills and shared memory one compile measured (Triton and TileLang
kernels alike). Plain data: importing it needs neither Triton nor a GPU.
``KernelSpec.from_jit`` reads a kernel's argument list from its ``@triton.jit``
function, importing the kernel's module only when called.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def resolve_kernel(path: str) -> Any:
    """The object that ``"package.module:attr"`` (dots allowed after the colon) names."""
    module_name, colon, attr_path = path.partition(":")
    if not colon or not module_name or not attr_path:
        raise ValueError(f"kernel {path!r}: expected 'package.module:attr'")
    obj = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def jit_params(fn: Any, path: str) -> list[tuple[str, bool, bool, Any]]:
    """``(name, is_constexpr, has_default, default)`` per argument of the ``@triton.jit``
    function ``fn`` (found at ``path``), in order, by Triton's own reading of the
    annotations: a ``JITFunction``'s ``params``, or for the interpreter's
    ``InterpretedFunction`` the same ``KernelParam`` built from its Python function."""
    params = getattr(fn, "params", None)
    if params is None:
        python_fn = getattr(fn, "fn", None)
        if not callable(python_fn) or not hasattr(fn, "arg_names"):
            raise TypeError(f"kernel {path!r} is not a @triton.jit function")
        from triton.runtime.jit import KernelParam

        params = [
            KernelParam(i, p, False, False)
            for i, p in enumerate(inspect.signature(python_fn).parameters.values())
        ]
    return [(p.name, p.is_constexpr, p.has_default, p.default) for p in params]


@dataclass(frozen=True)
class KernelSpec:
    """A kernel config as it ships; ``from_jit`` builds one from the kernel's own
    argument list.

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

    def divisible_args(self) -> frozenset[str]:
        """The arguments a launch of this spec passes divisible by 16: the pointers (when
        aligned) and ``ints_divisible_by_16``."""
        return frozenset(
            n
            for n, kind in self.signature.items()
            if (kind.startswith("*") and self.aligned_pointers) or n in self.ints_divisible_by_16
        )

    @classmethod
    def from_jit(
        cls,
        label: str,
        kernel: str,
        *,
        pointers: Mapping[str, str],
        scalars: Mapping[str, str] | None = None,
        constexprs: Mapping[str, int | bool | None] | None = None,
        num_warps: int = 4,
        num_stages: int = 1,
        aligned_pointers: bool = True,
        ints_divisible_by_16: tuple[str, ...] = (),
        maxnreg: int | None = None,
        min_ctas_per_sm: int = 1,
    ) -> KernelSpec:
        """The spec of ``kernel`` with its argument list read from the kernel itself.

        The ``@triton.jit`` function gives every argument's name, position and whether
        it is ``tl.constexpr``; the caller states only what that cannot tell:

        - ``pointers``: argument -> pointer type (``"*bf16"``, ``"*u8"``...). Every
          argument whose name ends in ``_ptr`` needs one (or a value in ``constexprs``);
          a pointer named otherwise (to keep another kernel's argument names) is listed
          here all the same, or it compiles as an ``i32`` and the compile fails.
        - ``scalars``: argument -> type for scalars that are not ``i32`` (``"i64"``,
          ``"fp32"``...). Every other argument is an ``i32``.
        - ``constexprs``: values of ``tl.constexpr`` arguments; one without a value
          takes its default. A plain argument given a value here is compiled as that
          constant (unit strides as 1, absent optional pointers as ``None``), as
          Triton specializes it at run time.
        - launch parameters and ``ints_divisible_by_16`` as in the class.

        The signature follows the kernel's argument order and the constexprs its order
        too. Refused with a ``ValueError`` naming the spec, the kernel and the argument:
        a name the kernel has no argument for, an argument named twice, a
        ``tl.constexpr`` argument given a type, a ``_ptr`` argument without a type, a
        pointer type not starting with ``*`` or a scalar type that does, a
        ``tl.constexpr`` without a value or default, and an ``ints_divisible_by_16``
        entry that is not an integer argument of the signature.
        """
        if isinstance(ints_divisible_by_16, str):
            raise ValueError(
                f"{label} ({kernel}): ints_divisible_by_16 is a tuple of argument names, "
                f"not the string {ints_divisible_by_16!r}"
            )
        scalars = dict(scalars or {})
        given_constexprs = dict(constexprs or {})
        where = f"{label} ({kernel})"
        params = jit_params(resolve_kernel(kernel), kernel)
        names = [name for name, *_ in params]
        for what, given in (
            ("pointers", pointers),
            ("scalars", scalars),
            ("constexprs", given_constexprs),
            ("ints_divisible_by_16", ints_divisible_by_16),
        ):
            for name in given:
                if name not in names:
                    raise ValueError(
                        f"{where}: {what} names {name!r}, which is not an argument of the "
                        f"kernel; its arguments are {', '.join(names)}"
                    )
        typed_constexprs = [
            n for n, is_cx, *_ in params if is_cx and (n in pointers or n in scalars)
        ]
        if typed_constexprs:
            raise ValueError(
                f"{where}: {typed_constexprs[0]!r} is a tl.constexpr: give its value in "
                "constexprs, not a type"
            )
        twice = sorted(set(pointers) & set(scalars))
        if twice:
            raise ValueError(f"{where}: {twice[0]!r} is in both pointers and scalars: keep one")
        typed_constants = sorted((set(pointers) | set(scalars)) & set(given_constexprs))
        if typed_constants:
            raise ValueError(
                f"{where}: {typed_constants[0]!r} has a type and a constexpr value: a constant "
                "has no type"
            )
        signature: dict[str, str] = {}
        values: dict[str, int | bool | None] = {}
        for name, is_constexpr, has_default, default in params:
            if is_constexpr:
                if name in given_constexprs:
                    values[name] = given_constexprs[name]
                elif has_default:
                    values[name] = default
                else:
                    raise ValueError(
                        f"{where}: tl.constexpr {name!r} has no default: give its value in "
                        "constexprs"
                    )
            elif name in given_constexprs:
                values[name] = given_constexprs[name]
            elif name in pointers:
                if not pointers[name].startswith("*"):
                    raise ValueError(
                        f"{where}: pointer {name!r} typed {pointers[name]!r}: pointer types "
                        "start with '*' (e.g. '*bf16'); scalars go in scalars"
                    )
                signature[name] = pointers[name]
            elif name.endswith("_ptr"):
                raise ValueError(
                    f"{where}: pointer argument {name!r} has no type: add it to pointers "
                    "(e.g. '*bf16')"
                )
            elif name in scalars:
                if scalars[name].startswith("*"):
                    raise ValueError(
                        f"{where}: scalar {name!r} typed {scalars[name]!r}: pointer types go "
                        "in pointers"
                    )
                signature[name] = scalars[name]
            else:
                signature[name] = "i32"
        for name in ints_divisible_by_16:
            if signature.get(name) not in ("i32", "i64"):
                raise ValueError(
                    f"{where}: ints_divisible_by_16 names {name!r}, which is not an integer "
                    "argument of the signature"
                )
        return cls(
            label=label,
            kernel=kernel,
            signature=signature,
            constexprs=values,
            num_warps=num_warps,
            num_stages=num_stages,
            aligned_pointers=aligned_pointers,
            ints_divisible_by_16=tuple(ints_divisible_by_16),
            maxnreg=maxnreg,
            min_ctas_per_sm=min_ctas_per_sm,
        )


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
    # True for a kernel that asks for more than 48 KB of shared memory per CTA (the
    # dynamic opt-in): it is held to its architecture's per-block limit instead.
    smem_optin: bool = False
