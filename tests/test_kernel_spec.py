"""KernelSpec.from_jit: the argument list comes from the kernel; what the kernel cannot
tell (pointer types, wider scalars, constexpr values) is refused when wrong or missing."""

import importlib

import pytest
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from deepinfer_sm80.kernel_spec import KernelSpec, jit_params, resolve_kernel
from deepinfer_sm80.ops.registry import OP_MODULES, all_ampere_kernel_specs

TOY = f"{__name__}:toy_kernel"


@triton.jit
def toy_kernel(
    x_ptr,
    x_stride,
    y,
    scale,
    n,
    unit_stride,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr = True,
):
    o = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + o * x_stride * unit_stride, mask=(o < n) | EVEN)
    tl.store(y + o, v * scale)


def toy(**kwargs) -> KernelSpec:
    args = {
        "pointers": {"x_ptr": "*bf16", "y": "*fp32"},
        "scalars": {"scale": "fp32"},
        "constexprs": {"unit_stride": 1, "BLOCK": 64},
        **kwargs,
    }
    return KernelSpec.from_jit("toy", TOY, **args)


def test_signature_follows_the_kernel():
    spec = toy(num_warps=2, ints_divisible_by_16=("x_stride",))
    assert list(spec.signature.items()) == [
        ("x_ptr", "*bf16"),
        ("x_stride", "i32"),
        ("y", "*fp32"),
        ("scale", "fp32"),
        ("n", "i32"),
    ]
    # Kernel order; the unset constexpr takes its default.
    assert list(spec.constexprs.items()) == [("unit_stride", 1), ("BLOCK", 64), ("EVEN", True)]
    assert (spec.kernel, spec.num_warps, spec.ints_divisible_by_16) == (TOY, 2, ("x_stride",))
    assert (
        toy(constexprs={"unit_stride": 1, "BLOCK": 64, "EVEN": False}).constexprs["EVEN"] is False
    )


def test_scalar_type_overrides_i32():
    assert toy(scalars={"scale": "fp32", "n": "i64"}).signature["n"] == "i64"


@pytest.mark.parametrize("field", ["pointers", "scalars", "constexprs", "ints_divisible_by_16"])
def test_unknown_argument_is_refused(field):
    given = {
        "pointers": {"x_ptr": "*bf16", "y": "*fp32", "z_ptr": "*bf16"},
        "scalars": {"scale": "fp32", "count": "i64"},
        "constexprs": {"unit_stride": 1, "BLOCK": 64, "BLOK": 32},
        "ints_divisible_by_16": ("x_stride", "stride"),
    }[field]
    with pytest.raises(ValueError, match=rf"toy \({TOY}\): {field} names '\w+', which is not an"):
        toy(**{field: given})


def test_pointer_without_type_is_refused():
    with pytest.raises(ValueError, match=r"toy \(.*\): pointer argument 'x_ptr' has no type"):
        toy(pointers={"y": "*fp32"})


def test_pointer_may_be_a_constant():
    spec = toy(pointers={"y": "*fp32"}, constexprs={"unit_stride": 1, "BLOCK": 64, "x_ptr": None})
    assert "x_ptr" not in spec.signature and spec.constexprs["x_ptr"] is None


def test_constexpr_without_value_or_default_is_refused():
    with pytest.raises(ValueError, match=r"toy \(.*\): tl.constexpr 'BLOCK' has no default"):
        toy(constexprs={"unit_stride": 1})


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"pointers": {"x_ptr": "bf16", "y": "*fp32"}}, "pointer 'x_ptr' typed 'bf16'"),
        ({"scalars": {"scale": "*fp32"}}, "scalar 'scale' typed '\\*fp32'"),
        ({"scalars": {"scale": "fp32", "BLOCK": "i32"}}, "'BLOCK' is a tl.constexpr"),
        ({"scalars": {"scale": "fp32", "y": "i32"}}, "'y' is in both pointers and scalars"),
        ({"scalars": {"scale": "fp32", "unit_stride": "i32"}}, "'unit_stride' has a type and"),
        (
            {"ints_divisible_by_16": ("x_ptr",)},
            "ints_divisible_by_16 names 'x_ptr', which is not an integer",
        ),
        (
            {"ints_divisible_by_16": ("scale",)},
            "ints_divisible_by_16 names 'scale', which is not an integer",
        ),
        ({"ints_divisible_by_16": "x_stride"}, "ints_divisible_by_16 is a tuple of argument"),
        (
            {"ints_divisible_by_16": ("BLOCK",)},
            "ints_divisible_by_16 names 'BLOCK', which is not an integer",
        ),
    ],
)
def test_wrong_types_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=r"toy \(.*\): " + message):
        toy(**kwargs)


def test_not_a_kernel_is_refused():
    with pytest.raises(TypeError, match=r"is not a @triton\.jit function"):
        KernelSpec.from_jit("toy", f"{__name__}:toy", pointers={})
    with pytest.raises(ValueError, match=r"expected 'package\.module:attr'"):
        resolve_kernel(__name__)


def test_compiled_and_interpreted_kernels_read_alike():
    """A JITFunction (GPU runs, AOT) and an InterpretedFunction (TRITON_INTERPRET=1) of
    the same function give the same argument list and constexpr reading."""
    for kernel in {spec.kernel for spec in all_ampere_kernel_specs()} | {TOY}:
        python_fn = resolve_kernel(kernel).fn
        compiled = jit_params(JITFunction(python_fn), kernel)
        interpreted = jit_params(InterpretedFunction(python_fn), kernel)
        assert compiled == interpreted, kernel
        assert any(is_constexpr for _, is_constexpr, _, _ in compiled), kernel


def test_registry_labels_are_unique_and_every_op_ships_specs():
    """Labels name the Ampere-fit test ids (tests/test_ampere_fit.py)."""
    labels = [spec.label for spec in all_ampere_kernel_specs()]
    assert len(labels) == len(set(labels)), sorted(x for x in labels if labels.count(x) > 1)
    for name in OP_MODULES:
        assert importlib.import_module(name).ampere_kernel_specs(), name
