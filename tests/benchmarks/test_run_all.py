"""benchmarks.run_all: every suite registered, suite selection, clear skips."""

import importlib
from pathlib import Path

import pytest

from benchmarks import run_all

# Module (named for its op) -> suite (a key of the result files, kept from before the rename).
SUITE_OF_MODULE = {
    "microbench_indexer_logits": "indexer",
    "microbench_inv_rope": "o_proj",
    "microbench_kv_cache": "kv_cache",
    "microbench_mhc": "mhc",
    "microbench_sparse_mla": "sparse_mla",
    "microbench_topk_swa": "topk_swa",
}


def test_every_suite_module_is_registered_and_named_for_its_op():
    """benchmarks/microbench_<op>.py: one module per suite, named for the op in
    overlay/deepinfer_sm80/ops/ it measures; every case it builds is filed under its suite."""
    bench_dir = Path(run_all.__file__).parent
    ops_dir = bench_dir.parent / "overlay" / "deepinfer_sm80" / "ops"
    modules = sorted(p.stem for p in bench_dir.glob("microbench_*.py"))
    assert modules == sorted(SUITE_OF_MODULE)
    assert sorted(SUITE_OF_MODULE.values()) == sorted(run_all.SUITES)
    for stem in modules:
        assert (ops_dir / stem.removeprefix("microbench_")).is_dir(), stem
        module = importlib.import_module(f"benchmarks.{stem}")
        assert SUITE_OF_MODULE[stem] == module.SUITE
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
