"""The SM80 coverage walk: which kernels and ops DeepSeek-V4.1 runs on Ampere, and that
each fits (tools/sm80_coverage.py states the rule).

- The rule on a small synthetic package (platform branches, method resolution, the
  ledger's per-binding redirect, cuts, device helpers, op aliases): it can fail.
- The walk over vLLM 0.33.0: known kernels and ops are found, ROCm/XPU ones are not,
  what the ledger replaces drops off, the allowlist is well formed and has no stale entry,
  every vLLM kernel left on the path has launch configs that match its signature.
- aot: every Triton kernel on the path compiles for sm_80 and sm_86 within its limits
  (ours: 48 KB, no spills; vLLM's: the arch's opt-in shared memory), and every known gap
  still fails. vLLM's TileLang kernels on the path (mHC prenorm GEMM and pre epilogue)
  compile for sm_80 and sm_86 with an explicit TileLang target at the specializations
  V4.1 compiles (the table is checked against vLLM's own dispatch and warmup keys),
  within the arch's opt-in shared memory, without spills, within the register file.
  Every library op on the path has sm_80/sm_86 device code.
- The coverage list is printed and written as JSON (``$DEEPINFER_COVERAGE_REPORT`` or the
  pytest cache directory).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from deepinfer_sm80 import envs
from deepinfer_sm80.ampere_fit import format_reports
from tools import sm80_coverage as cov
from tools import sm80_coverage_proof as proof
from tools import sm80_launch_configs as table
from tools.tiers import import_or_skip

import_or_skip("vllm")  # the walk reads vLLM's files; it does not import vLLM


def _cache_dir(request, name: str, tmp_path_factory) -> Path:
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir(name))
    return tmp_path_factory.mktemp(name)


@pytest.fixture(scope="session")
def coverage() -> cov.Coverage:
    return cov.analyze()


# ------------------------------------------------------------------ the rule, in small

_FIXTURE = {
    "__init__.py": "",
    "kernels.py": """
        import triton
        import triton.language as tl

        @triton.jit
        def helper(x):
            return x + 1

        @triton.jit
        def used_kernel(x_ptr, BLOCK: tl.constexpr):
            tl.store(x_ptr, helper(tl.load(x_ptr)))

        @triton.jit
        def rocm_kernel(x_ptr):
            pass

        @triton.jit
        def sm90_kernel(x_ptr):
            pass

        @triton.jit
        def replaced_kernel(x_ptr):
            pass

        @triton.jit
        def unused_kernel(x_ptr):
            pass

        def launch_used(x):
            used_kernel[(1,)](x, BLOCK=4)

        def launch_rocm(x):
            rocm_kernel[(1,)](x)

        def launch_sm90(x):
            sm90_kernel[(1,)](x)

        def launch_replaced(x):
            replaced_kernel[(1,)](x)
    """,
    "ours.py": """
        import triton

        @triton.jit
        def our_kernel(x_ptr):
            pass

        def launch_replaced(x):
            our_kernel[(1,)](x)
    """,
    "model.py": """
        import torch
        from covfixture import kernels
        from covfixture.kernels import launch_replaced

        ops = torch.ops._C

        class Base:
            def forward(self, x):
                kernels.launch_used(x)

            def overridden(self, x):
                torch.ops._C.base_op(x)

        class Model(Base):
            def forward(self, x):
                if current_platform.is_rocm():
                    kernels.launch_rocm(x)
                if current_platform.has_device_capability(90) and x:
                    kernels.launch_sm90(x)
                launch_replaced(x)
                ops.aliased_op(x)
                self.overridden(x)
                super().forward(x)

            def overridden(self, x):
                return x

            def never_named(self):
                torch.ops._C.dead_op()
    """,
}


@pytest.fixture
def fixture_index(tmp_path, monkeypatch) -> cov.SourceIndex:
    package = tmp_path / "covfixture"
    package.mkdir()
    for name, text in _FIXTURE.items():
        (package / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return cov.SourceIndex(packages=("covfixture",))


def _walk(index, **kwargs) -> cov.Walk:
    return cov.Walk(index, roots=("covfixture.model:Model",), **kwargs)


def test_rule_on_a_small_package(fixture_index):
    walk = _walk(fixture_index)
    live = set(walk.live_kernels)
    assert "covfixture.kernels:used_kernel" in live
    assert "covfixture.kernels:replaced_kernel" in live
    # dead platform branches, and a kernel nothing names
    assert "covfixture.kernels:rocm_kernel" not in live
    assert "covfixture.kernels:sm90_kernel" not in live
    assert "covfixture.kernels:unused_kernel" not in live
    helper = walk.kernels["covfixture.kernels:helper"]
    assert walk.is_device_helper(helper)
    assert not walk.is_device_helper(walk.kernels["covfixture.kernels:used_kernel"])
    # an alias of torch.ops._C; an overridden base method and an unnamed method do not run
    assert set(walk.live_ops) == {"_C::aliased_op"}


def test_ledger_redirects_only_the_binding_it_names(fixture_index):
    # the module that looks the name up is patched: the kernel drops off, ours joins
    walk = _walk(
        fixture_index,
        redirects={"covfixture.model:launch_replaced": "covfixture.ours:launch_replaced"},
    )
    assert "covfixture.kernels:replaced_kernel" not in walk.live_kernels
    assert "covfixture.ours:our_kernel" in walk.live_kernels
    # patching only where it is defined misses model.py's own copy of the name
    walk = _walk(
        fixture_index,
        redirects={"covfixture.kernels:launch_replaced": "covfixture.ours:launch_replaced"},
    )
    assert "covfixture.kernels:replaced_kernel" in walk.live_kernels
    # a target naming the kernel itself removes it
    walk = _walk(
        fixture_index,
        redirects={"covfixture.kernels:replaced_kernel": "covfixture.ours:our_kernel"},
    )
    assert "covfixture.kernels:replaced_kernel" not in walk.live_kernels


def test_cuts_stop_the_walk_and_record_the_hit(fixture_index):
    walk = _walk(fixture_index, cuts=["covfixture.kernels:launch_used"])
    assert "covfixture.kernels:used_kernel" not in walk.live_kernels
    assert walk.cut_hits["covfixture.kernels:launch_used"]
    walk = _walk(
        fixture_index,
        cuts={"covfixture.model:Base": ["covfixture.kernels:launch_rocm"]},
    )
    assert "covfixture.kernels:used_kernel" not in walk.live_kernels
    assert "covfixture.kernels:rocm_kernel" in walk.live_kernels  # what the cut selects


@pytest.mark.parametrize(
    "test,truth",
    [
        ("current_platform.is_rocm()", False),
        ("not current_platform.is_xpu()", True),
        ("current_platform.is_cuda()", True),
        ("current_platform.is_device_capability(90)", False),
        ("current_platform.is_device_capability((8, 0))", None),  # true on 80, not 86
        ("current_platform.has_device_capability(80)", True),
        ("current_platform.has_device_capability(89)", False),
        ("current_platform.is_device_capability_family(100)", False),
        ("current_platform.is_rocm() or x", None),
        ("current_platform.is_rocm() and x", False),
        ("is_deep_gemm_supported()", False),
        ("TYPE_CHECKING", False),
        ("x > 1", None),
    ],
)
def test_platform_truth(test, truth):
    assert cov.platform_truth(ast.parse(test, mode="eval").body) is truth


# ------------------------------------------------------------------ the walk over vLLM

ON_PATH = (
    "vllm.v1.attention.backends.mla.sparse_swa:_compute_swa_indices_and_lens_kernel",
    "vllm.models.deepseek_v41.common.ops.cache_utils:CombineTopkSwaIndicesKernel.kernel",
    "vllm.models.deepseek_v41.common.engram:_hash_ids_kernel",
    "vllm.model_executor.layers.fused_moe.router.dsv4_topk:_dsv4_topk_kernel",
    "deepinfer_sm80.ops.kv_cache.triton_kernel:kv_gather_v4_kernel",
    "deepinfer_sm80.ops.sparse_mla.triton_kernel:sparse_mla_fwd_kernel",
)
OPS_ON_PATH = (
    "_C::persistent_topk",
    "_C::fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert",
    "_moe_C::moe_wna16_marlin_gemm",
)


def test_walk_finds_the_known_path(coverage):
    for kernel in ON_PATH:
        assert kernel in coverage.kernels_on_path, kernel
    for op in OPS_ON_PATH:
        assert op in coverage.ops_on_path, op
    assert len(coverage.found_kernels) > len(coverage.kernels_on_path) > 30


def test_rocm_xpu_and_replaced_code_is_off_the_path(coverage):
    platform_specific = [
        k
        for k in coverage.kernels_on_path
        if any(part in ("amd", "rocm", "xpu", "cpu") for part in k.split(":")[0].split("."))
        or "rocm" in k.split(":")[0]
    ]
    assert not platform_specific
    assert not [op for op in coverage.ops_on_path if op.split("::")[0] in ("_rocm_C", "_xpu_C")]
    # the kv-gather ledger entry and the plugin's attention layer
    gather = "vllm.models.deepseek_v41.common.ops.cache_utils:_dequantize_and_gather_k_kernel"
    assert gather in coverage.replaced_kernels
    assert not [op for op in coverage.ops_on_path if op.startswith("_flashmla")]


def test_without_the_ledger_the_replaced_kernels_are_on_the_path(coverage):
    before = coverage.before_ledger.live_kernels
    assert set(coverage.replaced_kernels) <= set(before)
    assert coverage.replaced_kernels, "the ledger replaces no kernel?"


def test_allowlist_is_well_formed(tmp_path):
    allowlist = cov.load_allowlist()
    assert allowlist.entries
    for entry in allowlist.entries:
        assert entry.reason and entry.category in allowlist.categories
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "categories: {sm100-only: x, pending-replacement: y}\n"
        "entries:\n"
        "  - cut: vllm.a\n    category: sm100-only\n"
        "  - kernel: vllm.a:k\n    category: nope\n    reason: r\n"
        "  - kernel: vllm.a:k2\n    category: pending-replacement\n    reason: r\n"
        "  - kernel: vllm.a:k3\n    op: x::y\n    category: sm100-only\n    reason: r\n"
    )
    with pytest.raises(cov.AllowlistError) as err:
        cov.load_allowlist(bad)
    message = str(err.value)
    assert "one-line reason" in message
    assert "'nope'" in message
    assert "helper" in message
    assert "exactly one of" in message


def test_allowlist_has_no_stale_entries(coverage):
    stale = coverage.stale_entries()
    assert not stale, "remove (or fix) these allowlist entries:\n" + "\n".join(stale)


def test_stale_entries_are_reported(coverage):
    fake = dataclasses.replace(
        coverage.allowlist,
        entries=(
            *coverage.allowlist.entries,
            cov.AllowEntry("kernel", "vllm.no.such:kernel", "known-gap", "r"),
            cov.AllowEntry("op", "_C::no_such_op", "known-gap", "r"),
        ),
    )
    stale = dataclasses.replace(coverage, allowlist=fake).stale_entries()
    assert any("vllm.no.such:kernel: no such kernel" in s for s in stale)
    assert any("_C::no_such_op" in s for s in stale)


def test_our_tilelang_kernels_are_on_the_path_and_checked_by_their_module(coverage):
    """The sparse-MLA decode's TileLang kernel is reached from the plugin; the proof
    accepts it because its module defines fit_reports() (test_tilelang_kernels_fit_ampere
    checks them), and would refuse a module without one."""
    ours = [
        k
        for k, v in coverage.kernels_on_path.items()
        if v.kind == "tilelang" and v.is_ours and "sparse_mla.tilelang_kernels" in k
    ]
    assert ours, "the TileLang decode kernel is not on the walked path"
    index = coverage.final.index
    assert proof.ships_tilelang_fit(index, "deepinfer_sm80.ops.sparse_mla.tilelang_kernels")
    assert not proof.ships_tilelang_fit(index, "deepinfer_sm80.ops.engram.triton_kernel")


def test_every_kernel_on_the_path_has_launch_configs(coverage):
    _, problems = proof.aot_specs(coverage)
    assert not problems, "\n".join(problems)
    assert not proof.stale_table_entries(coverage), "launch configs of kernels off the path"


def test_launch_table_call_sites_exist():
    root = cov.package_root("vllm").parent
    for kid, launches in {**table.VLLM_LAUNCHES, **table.VLLM_TILELANG_LAUNCHES}.items():
        for launch in launches:
            path, _, line = launch.call_site.rpartition(":")
            lines = (root / path).read_text().splitlines()
            assert 0 < int(line) <= len(lines), f"{kid}: {launch.call_site}"


def test_launch_table_is_checked_against_signatures(coverage):
    kid = "vllm.models.deepseek_v41.common.engram:_engram_select_rows_kernel"
    params = proof.kernel_params(coverage.kernels_on_path[kid])
    assert not table.table_problems(kid, params)
    renamed = [("gathered_rows" if p[0] == "gathered" else p[0], *p[1:]) for p in params]
    assert any("no arguments ['gathered']" in p for p in table.table_problems(kid, renamed))
    extra = [*params, ("NEW_CONSTEXPR", True, None)]
    assert any("NEW_CONSTEXPR has no value" in p for p in table.table_problems(kid, extra))


TILELANG_ON_PATH = tuple(
    f"vllm.model_executor.kernels.mhc.tilelang_kernels:{name}"
    for name in (
        "hc_prenorm_gemm_tilelang",
        "hc_prenorm_gemm_block_m_tilelang",
        "mhc_pre_big_fuse_tilelang",
        "mhc_pre_big_fuse_with_norm_tilelang",
    )
)


def test_tilelang_kernels_on_the_path_are_compiled_not_allowlisted(coverage):
    # mhc_pre_delayed_tilelang (first layer, Engram layers) runs them on SM8x
    for kid in TILELANG_ON_PATH:
        assert kid in coverage.kernels_to_check, kid
    specs, problems = proof.tilelang_specs(coverage)
    assert not problems, "\n".join(problems)
    assert {s.kernel for s in specs} == set(TILELANG_ON_PATH)
    # the Triton collapse (hc_collapse_triton's kernel) is compiled as a Triton kernel
    triton_specs, _ = proof.aot_specs(coverage)
    collapse = "vllm.model_executor.kernels.mhc.triton:_hc_head_reduce_store_kernel"
    assert collapse in coverage.kernels_to_check
    assert any(s.kernel == collapse for s in triton_specs)


def test_tilelang_table_matches_vllm_dispatch(monkeypatch):
    assert not table.tilelang_dispatch_problems()
    # it can fail: drop the 128..1023-token GEMM bucket and the split-8 epilogues
    kid = TILELANG_ON_PATH[0]
    norm = TILELANG_ON_PATH[3]
    trimmed = {
        **table.VLLM_TILELANG_LAUNCHES,
        kid: [x for x in table.VLLM_TILELANG_LAUNCHES[kid] if x.params["n_thr"] != 512],
        norm: [x for x in table.VLLM_TILELANG_LAUNCHES[norm] if x.params["n_splits"] != 8],
    }
    monkeypatch.setattr(table, "VLLM_TILELANG_LAUNCHES", trimmed)
    problems = table.tilelang_dispatch_problems()
    assert any("hc_prenorm_gemm_tilelang" in p and "'n_thr': 512" in p for p in problems)
    assert any("with_norm" in p and "'n_splits': 8" in p for p in problems)


def test_tilelang_table_is_checked_against_signatures(coverage):
    kid = TILELANG_ON_PATH[0]
    params = proof.tilelang_params(coverage.kernels_on_path[kid])
    assert not table.tilelang_table_problems(kid, params)
    renamed = [("width" if p[0] == "hidden_size" else p[0], *p[1:]) for p in params]
    problems = table.tilelang_table_problems(kid, renamed)
    assert any("no parameters ['hidden_size']" in p for p in problems)
    assert any("parameter width has no value" in p for p in problems)
    extra_tensor = [("bias", None, None), *params]
    assert any("tensor stand-ins" in p for p in table.tilelang_table_problems(kid, extra_tensor))


def test_tilelang_limits_are_the_arch_limits():
    from deepinfer_sm80.kernel_spec import FitReport

    def report(arch, smem=1024, regs=64, threads=1024, spill=0, error=None):
        return FitReport("k", arch, smem, regs, spill, spill, error=error, threads=threads)

    assert not proof.tilelang_limit_problems([report("sm_80"), report("sm_86")])
    # real opt-in limits, not our 48 KB: 101,376 B fits sm86 and 166,912 B fits sm80
    assert not proof.tilelang_limit_problems([report("sm_80", 166_912), report("sm_86", 101_376)])
    assert proof.tilelang_limit_problems([report("sm_86", 101_377)])
    assert proof.tilelang_limit_problems([report("sm_80", 166_913)])
    assert proof.tilelang_limit_problems([report("sm_80", spill=4)])
    assert proof.tilelang_limit_problems([report("sm_80", regs=65)])  # 65 x 1024 > 64K
    assert proof.tilelang_limit_problems([report("sm_80", threads=0)])
    failed = FitReport("k", "sm_80", None, None, None, None, error="boom")
    assert "compile failed: boom" in proof.tilelang_limit_problems([failed])[0]


def test_coverage_list_is_reported(coverage, request, tmp_path_factory):
    report = proof.coverage_report(coverage)
    text = proof.format_coverage(report)
    print("\n" + text)
    counts = report["counts"]
    assert counts["kernels_on_path"] == len(coverage.kernels_on_path)
    assert counts["kernels_compiled"] == len(coverage.kernels_to_check)
    statuses = {k["id"]: k["status"] for k in report["kernels"]}
    assert statuses[ON_PATH[0]] == "compiled for sm_80/sm_86"
    target = envs.get("DEEPINFER_COVERAGE_REPORT")
    out = Path(target) if target else _cache_dir(request, "sm80_coverage", tmp_path_factory)
    if out.is_dir():
        out = out / "coverage.json"
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"coverage list written to {out}")


# ------------------------------------------------------------------ Ampere fitness


@pytest.mark.aot
def test_kernels_on_the_path_compile_for_sm80_and_sm86(coverage, request, tmp_path_factory):
    specs, problems = proof.aot_specs(coverage)
    assert not problems, "\n".join(problems)
    reports = proof.compile_cached(
        specs,
        _cache_dir(request, "sm80_coverage_aot", tmp_path_factory),
        coverage.final.index,
    )
    print("\n" + format_reports(reports))
    assert len(reports) == 2 * len(specs)
    gaps = proof.known_gaps(coverage)
    gap_labels = {s.label for s in specs if s.kernel in gaps}
    ours = {s.label for s in specs if s.kernel.startswith("deepinfer_sm80.ops")}
    checked = [r for r in reports if r.label not in gap_labels]
    failures = proof.limit_problems(checked, ours)
    still_failing = {r.label for r in reports if r.label in gap_labels and r.error}
    fixed = sorted(gap_labels - still_failing)
    report = proof.coverage_report(coverage, reports, specs)
    (_cache_dir(request, "sm80_coverage", tmp_path_factory) / "coverage_aot.json").write_text(
        json.dumps(report, indent=1, default=str)
    )
    assert not failures, "\n".join(failures)
    assert not fixed, f"known gaps that now compile, remove their allowlist entries: {fixed}"


@pytest.mark.aot
def test_tilelang_kernels_on_the_path_compile_for_sm80_and_sm86(
    coverage, request, tmp_path_factory
):
    specs, problems = proof.tilelang_specs(coverage)
    assert not problems, "\n".join(problems)
    assert specs
    reports = proof.compile_tilelang_cached(
        specs,
        _cache_dir(request, "sm80_coverage_aot", tmp_path_factory),
        coverage.final.index,
    )
    print("\n" + format_reports(reports))
    assert [r.arch for r in reports] == ["sm_80", "sm_86"] * len(specs)
    gap_labels = {s.label for s in specs if s.kernel in proof.known_gaps(coverage)}
    checked = [r for r in reports if r.label not in gap_labels]
    failures = proof.tilelang_limit_problems(checked)
    fixed = sorted(gap_labels - {r.label for r in reports if r.label in gap_labels and r.error})
    assert not failures, "\n".join(failures)
    assert not fixed, f"known gaps that now compile, remove their allowlist entries: {fixed}"


@pytest.mark.aot
def test_library_ops_on_the_path_have_sm80_and_sm86_code(coverage, request, tmp_path_factory):
    codes = proof.check_ops(coverage, _cache_dir(request, "sm80_coverage_cubins", tmp_path_factory))
    for code in codes:
        kernels = {a: n for a, n in code.kernels.items() if n}
        print(
            f"{code.op:60} {code.library}  sm_80<-{code.library_archs.get('sm_80')}  "
            f"kernels by name: {kernels or 'unmatched (library-level check)'}"
        )
    problems = [p for code in codes for p in code.problems()]
    assert codes
    assert not problems, "\n".join(problems)
