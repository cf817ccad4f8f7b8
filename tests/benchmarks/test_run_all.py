"""benchmarks.run_all: every suite registered, suite selection, clear skips."""

import pytest

from benchmarks import run_all


def test_every_suite_module_is_registered():
    from pathlib import Path

    modules = {p.stem for p in Path(run_all.__file__).parent.glob("microbench_*.py")}
    assert len(run_all.SUITES) == len(modules) == 5


def test_unknown_suite_is_refused(capsys):
    with pytest.raises(SystemExit):
        run_all.main(["--suite", "nope"])
    assert "invalid choice" in capsys.readouterr().err


def test_suite_needing_a_missing_package_is_reported_not_crashed(monkeypatch, capsys):
    monkeypatch.setitem(run_all.NEEDS, "part3", "no_such_package_xyz")
    assert run_all.main(["--suite", "part3", "--no-charts"]) == 1
    assert "needs `no_such_package_xyz`" in capsys.readouterr().out
