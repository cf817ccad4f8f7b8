"""Ampere fitness tier: every shipped kernel config compiles for sm_80 and sm_86 with
<= 48 KB shared memory per CTA, no register spills and registers for the CTAs per SM it
states (AOT, no GPU needed). One test id per spec label and arch."""

import dataclasses

import pytest

from deepinfer_sm80.ampere_fit import (
    compile_for_ampere,
    fit_violations,
    format_reports,
)
from deepinfer_sm80.arch import AMPERE_CCS
from deepinfer_sm80.kernel_spec import FitReport, KernelSpec
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs

pytestmark = pytest.mark.aot

SHIPPED = all_ampere_kernel_specs()
CCS = list(AMPERE_CCS)


@pytest.fixture(scope="module")
def shipped_reports(request) -> dict[tuple[str, str], FitReport]:
    """The specs and arches of the selected ``test_shipped_spec_fits_ampere`` ids (all of
    them unless ``-k`` narrows the run), compiled in one subprocess."""
    selected = [
        item.callspec.params
        for item in request.session.items
        if getattr(item, "function", None) is test_shipped_spec_fits_ampere
    ]
    labels = {params["spec"].label for params in selected}
    specs = [spec for spec in SHIPPED if spec.label in labels]
    ccs = sorted({params["cc"] for params in selected})
    reports = compile_for_ampere(specs, ccs)
    print("\n" + format_reports(reports))
    assert len(reports) == len(specs) * len(ccs)
    return {(r.label, r.arch): r for r in reports}


@pytest.mark.parametrize(
    "spec,cc",
    [pytest.param(spec, cc, id=f"{spec.label}-sm_{cc}") for spec in SHIPPED for cc in CCS],
)
def test_shipped_spec_fits_ampere(spec, cc, shipped_reports):
    report = shipped_reports[(spec.label, f"sm_{cc}")]
    assert (report.threads, report.min_ctas_per_sm) == (32 * spec.num_warps, spec.min_ctas_per_sm)
    problems = fit_violations([report])
    assert not problems, "\n".join(problems)


def test_registry_covers_both_arches():
    assert len(SHIPPED) >= 10
    assert CCS == [80, 86]


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


def _report(arch: str, shared: int, ctas: int, regs: int = 32, threads: int = 128) -> FitReport:
    return FitReport("k", arch, shared, regs, 0, 0, threads=threads, min_ctas_per_sm=ctas)


def test_ctas_per_sm_must_fit_the_sms_shared_memory():
    """Three CTAs of 40,000 B (plus 1 KB each for the driver) fit sm_80's 164 KB per SM,
    not sm_86's 100 KB; a Hopper-proxy build is held to sm_86's; two of 48 KB fit both."""
    assert fit_violations([_report("sm_80", 40_000, 3)]) == []
    (problem,) = fit_violations([_report("sm_86", 40_000, 3)])
    assert problem == (
        "k on sm_86: 3 CTAs per SM x (40000 B + 1024 B reserved) = 123072 B shared memory "
        "> the SM's 102400 B"
    )
    assert fit_violations([_report("sm_90", 40_000, 3)]) == [problem.replace("sm_86", "sm_90")]
    assert fit_violations([_report(a, 48 * 1024, 2) for a in ("sm_80", "sm_86", "sm_90")]) == []


def test_a_report_of_an_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match="no limits for 'sm_89'"):
        fit_violations([_report("sm_89", 1024, 1)])


def test_an_optin_kernel_is_held_to_its_architectures_block_limit():
    """A kernel marked smem_optin (more than 48 KB by the dynamic opt-in) may use up to
    its arch's per-block limit: 120,000 B fits sm_80 (166,912 B), not sm_86 (101,376 B);
    unmarked, 50,000 B is over the 48 KB of a static allocation anywhere."""
    optin = FitReport("k", "sm_80", 120_000, 230, 0, 0, threads=256, smem_optin=True)
    assert fit_violations([optin]) == []
    problem, per_sm = fit_violations([dataclasses.replace(optin, arch="sm_86")])
    assert problem == (
        "k on sm_86: 120000 B shared memory > 101376 B (sm_86's opt-in limit per block)"
    )
    assert per_sm.endswith("= 121024 B shared memory > the SM's 102400 B")
    (problem,) = fit_violations([_report("sm_80", 50_000, 1)])
    assert problem == "k on sm_80: 50000 B shared memory > 49152 B"
