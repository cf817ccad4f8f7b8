"""Compile a Triton ``KernelSpec`` as a launch of it compiles, on a machine without a GPU.

Triton finds a compiled kernel in its cache by a key made of the kernel's source, the
target, the launch options and the argument specialization, in the exact form its JIT
launcher builds (``JITFunction.run``): every non-constexpr argument gets an attribute
entry, empty for an argument that is not divisible by 16. A cache entry written by
``triton.compile`` with a hand-built ``ASTSource`` lists only the divisible arguments, so
its key differs and a server never finds it. Here the spec goes through the launcher
itself (``JITFunction.warmup``, which specializes and compiles without launching) with
arguments that have the spec's properties, against a driver that only names the target:
the entry it writes is the one a server launching the kernel with such arguments looks
up. What Triton specialized is then checked against the spec, so a spec that no launch
can produce fails here, naming the argument.

The cache key also holds ``triton_key()``: a hash of Triton's sources and of its compiled
library, which differs between the builds of one Triton version for two Python versions.
``build_id`` records it; the plugin seeds only entries of the running Triton's build.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from typing import Any

from deepinfer_sm80.kernel_spec import KernelSpec, resolve_kernel

# A value per integer type with the given divisibility that Triton types as that type: 1
# is avoided (Triton turns an integer argument equal to 1 into a constexpr), and an i64
# argument holds a value past the i32 range (Triton types smaller values i32).
_INT_VALUES = {
    ("i32", True): 4096,
    ("i32", False): 4097,
    ("i64", True): 2**32,
    ("i64", False): 2**32 + 1,
}
_FLOAT_TYPES = ("fp32",)


def _torch_dtype(triton_type: str) -> Any:
    import torch

    dtypes = {
        "*bf16": torch.bfloat16,
        "*fp16": torch.float16,
        "*fp32": torch.float32,
        "*u8": torch.uint8,
        "*i8": torch.int8,
        "*i16": torch.int16,
        "*i32": torch.int32,
        "*i64": torch.int64,
        "*u1": torch.bool,  # Triton types a bool tensor *u1
        "*fp8e4nv": torch.float8_e4m3fn,
        "*fp8e5": torch.float8_e5m2,
    }
    if triton_type not in dtypes:
        raise ValueError(
            f"pointer type {triton_type!r}: no torch dtype known for it "
            f"(known: {sorted(dtypes)}); add it to triton_launch_compile"
        )
    return dtypes[triton_type]


class _Pointer:
    """A tensor stand-in for the launcher: a dtype and an address, aligned to 16 or not."""

    def __init__(self, dtype: Any, aligned: bool):
        self.dtype = dtype
        self._address = 0 if aligned else 8

    def data_ptr(self) -> int:
        return self._address


class _TargetOnlyDriver:
    """Enough of a Triton driver for ``warmup``: the target to compile for and a device id.
    Each capability gets its own device id, because a ``JITFunction`` keeps its target per
    device."""

    def __init__(self, cc: int):
        from triton.backends.compiler import GPUTarget

        self.cc = cc
        self._target = GPUTarget("cuda", cc, 32)

    def get_current_target(self):
        return self._target

    def get_current_device(self) -> int:
        return self.cc

    def get_current_stream(self, device=None) -> int:
        return 0


@contextlib.contextmanager
def target_only(cc: int):
    """Triton's launchers compile for capability ``cc`` (and launch nothing) inside."""
    from triton.runtime import driver

    previous = driver._active  # None on a machine without a GPU: nothing to restore to
    driver.set_active(_TargetOnlyDriver(cc))
    try:
        yield
    finally:
        driver._active = previous


@contextlib.contextmanager
def _capture_compiles(seen: list[dict]):
    from triton import knobs

    previous = knobs.runtime.jit_post_compile_hook

    def hook(*, compile, **_):
        seen.append(compile)
        return previous(compile=compile, **_) if previous else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield
    finally:
        knobs.runtime.jit_post_compile_hook = previous


def launch_args(spec: KernelSpec, arg_names: list[str]) -> list[Any]:
    """Arguments in the kernel's order that a launch specializes as ``spec`` says."""
    args = []
    for name in arg_names:
        if name in spec.constexprs:
            args.append(spec.constexprs[name])
            continue
        kind = spec.signature[name]
        if kind.startswith("*"):
            args.append(_Pointer(_torch_dtype(kind), spec.aligned_pointers))
        elif (kind, name in spec.ints_divisible_by_16) in _INT_VALUES:
            args.append(_INT_VALUES[(kind, name in spec.ints_divisible_by_16)])
        elif kind in _FLOAT_TYPES:
            args.append(0.5)
        elif kind == "i1":  # a Python bool, not a constexpr
            args.append(True)
        else:
            raise ValueError(f"{spec.label}: argument {name!r} has type {kind!r}, "
                             f"which this build cannot stand in for")  # fmt: skip
    return args


def compile_as_launched(spec: KernelSpec, cc: int):
    """The ``CompiledKernel`` a launch of ``spec`` on a GPU of capability ``cc`` uses,
    compiled (or found) in ``TRITON_CACHE_DIR`` under the key that launch looks up.
    Raises ``ValueError`` where Triton specializes an argument unlike the spec."""
    fn = resolve_kernel(spec.kernel)
    names = list(fn.arg_names)
    unknown = (set(spec.signature) | set(spec.constexprs)) - set(names)
    if unknown:
        raise ValueError(f"{spec.kernel} has no arguments named {sorted(unknown)}")
    missing = [n for n in names if n not in spec.signature and n not in spec.constexprs]
    if missing:
        raise ValueError(f"{spec.label}: arguments {missing} missing from the spec")
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.maxnreg:
        options["maxnreg"] = spec.maxnreg
    seen: list[dict] = []
    with target_only(cc), _capture_compiles(seen):
        kernel = fn.warmup(*launch_args(spec, names), grid=(1,), **options)
    if seen:  # none: this process compiled the same launch for an earlier spec
        _check_specialization(spec, names, seen[-1])
    return kernel


def _check_specialization(spec: KernelSpec, names: list[str], compiled: dict) -> None:
    signature = compiled["signature"]
    wanted = {n: ("constexpr" if n in spec.constexprs else spec.signature[n]) for n in names}
    wrong = {n: (wanted[n], signature.get(n)) for n in names if signature.get(n) != wanted[n]}
    if wrong:
        raise ValueError(
            f"{spec.label}: Triton's launcher typed arguments unlike the spec "
            f"(name: (spec, launcher)): {wrong}"
        )
    attrs = compiled["configs"][0]
    divisible = {
        names[path[0]]
        for path, values in attrs.items()
        if ["tt.divisibility", 16] in [list(v) for v in values]
    }
    expected = spec.divisible_args()
    if divisible != expected:
        raise ValueError(
            f"{spec.label}: Triton's launcher took {sorted(divisible)} as divisible by 16, "
            f"the spec {sorted(expected)}"
        )


def build_id() -> dict[str, str]:
    """What makes this process's Triton cache keys its own: the Triton version, the
    Python version its compiled library is built for, and a digest of ``triton_key()``."""
    import triton
    from triton.runtime.cache import triton_key

    return {
        "triton": triton.__version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "triton_key_sha256": hashlib.sha256(triton_key().encode()).hexdigest(),
    }
