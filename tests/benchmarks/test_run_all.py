"""benchmarks.run_all: every suite registered, suite selection, clear skips."""

import importlib
from pathlib import Path

import pytest

from benchmarks import run_all


def test_every_suite_module_is_registered_under_its_op_name():
    """benchmarks/microbench_<suite>.py: one module per suite, both named for the op(s)
    it measures; every case it builds is filed under that suite."""
    modules = sorted(p.stem for p in Path(run_all.__file__).parent.glob("microbench_*.py"))
    assert modules == sorted(f"microbench_{suite}" for suite in run_all.SUITES)
    assert len(modules) == 6
    for stem in modules:
        module = importlib.import_module(f"benchmarks.{stem}")
        assert stem.removeprefix("microbench_") == module.SUITE
        assert run_all.SUITES[module.SUITE] is module.build_registry
        cases = module.build_registry().cases()
        assert cases and {c.suite for c in cases} == {module.SUITE}


def test_sparse_mla_and_kv_cache_suites_hold_their_own_cases():
    from benchmarks import microbench_kv_cache, microbench_sparse_mla

    mla = [c.name for c in microbench_sparse_mla.build_registry().cases()]
    kv = [c.name for c in microbench_kv_cache.build_registry().cases()]
    assert len(mla) == 36 and all(n.startswith(("mla_decode_", "mla_prefill_")) for n in mla)
    assert kv == ["gather_16K", "gather_48K", "gather_4x16K_chunk",
                  "gather_1M_ratio2_compressed", "insert_T1_bs64", "insert_T128_bs64",
                  "insert_T4096_bs64"]  # fmt: skip
    # run_all runs them in this order: the sparse MLA cases first, as one suite did.
    suites = list(run_all.SUITES)
    assert suites.index("sparse_mla") + 1 == suites.index("kv_cache")


def test_unknown_suite_is_refused(capsys):
    with pytest.raises(SystemExit):
        run_all.main(["--suite", "nope"])
    assert "invalid choice" in capsys.readouterr().err


def test_suite_needing_a_missing_package_is_reported_not_crashed(monkeypatch, capsys):
    monkeypatch.setitem(run_all.NEEDS, "topk_swa", "no_such_package_xyz")
    assert run_all.main(["--suite", "topk_swa", "--no-charts"]) == 1
    assert "needs `no_such_package_xyz`" in capsys.readouterr().out
