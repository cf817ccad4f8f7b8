"""Ampere fitness tier: every shipped kernel config compiles for sm_80 and sm_86 with
<= 48 KB shared memory per CTA and no register spills (AOT, no GPU needed)."""

import pytest

from deepinfer_sm80.ampere_fit import (
    compile_for_ampere,
    fit_violations,
    format_reports,
)
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs

pytestmark = pytest.mark.aot


def test_shipped_kernel_configs_fit_ampere():
    specs = all_ampere_kernel_specs()
    assert len(specs) >= 10
    reports = compile_for_ampere(specs)
    print("\n" + format_reports(reports))
    assert {r.arch for r in reports} == {"sm_80", "sm_86"}
    assert len(reports) == 2 * len(specs)
    problems = fit_violations(reports)
    assert not problems, "\n".join(problems)


def test_check_rejects_fp8e4nv_and_oversized_shared_memory():
    bad = [
        KernelSpec(
            label="fp8e4nv",
            kernel="tests.ampere_bad_kernels:uses_fp8e4nv",
            signature={"x_ptr": "*u8", "y_ptr": "*fp32"},
            constexprs={"BLOCK": 128},
        ),
        KernelSpec(
            label="big-dot",
            kernel="tests.ampere_bad_kernels:big_shared_dot",
            signature={"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*fp32"},
            constexprs={"BLOCK": 128, "K": 128},
            num_warps=8,
            num_stages=3,
        ),
    ]
    reports = compile_for_ampere(bad, ccs=[80])
    problems = fit_violations(reports)
    print("\n" + format_reports(reports))
    assert any(p.startswith("fp8e4nv on sm_80: compile failed") for p in problems), problems
    assert any(p.startswith("big-dot on sm_80:") and "shared memory" in p for p in problems), (
        problems
    )


def test_spec_with_unknown_argument_is_reported():
    spec = KernelSpec(
        label="typo",
        kernel="deepinfer_sm80.ops.kv_cache.triton_kernel:kv_insert_v4_kernel",
        signature={"k_pointer": "*bf16"},
    )
    (report,) = compile_for_ampere([spec], ccs=[80])
    assert report.error and "k_pointer" in report.error
