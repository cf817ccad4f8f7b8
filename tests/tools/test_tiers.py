"""Required tiers (tools/tiers.py and the hooks in tests/conftest.py), run on a small
suite with this project's conftest: a skip in a required tier fails, naming the test,
the flag and the reason; other skips stay skips; the tiers summary says what ran."""

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).resolve().parents[1] / "conftest.py").read_text()
MARKERS = """
[pytest]
markers =
    gpu: x
    vllm: x
    aot: x
    tools: x
    image: x
"""
SUITE = """
import pytest
from tools.tiers import skip_not_applicable

@pytest.mark.vllm
def test_needs_vllm():
    pytest.skip("vllm.fake is missing")

@pytest.mark.vllm
def test_wrong_gpu():
    skip_not_applicable("needs sm89+")

@pytest.mark.tools
def test_needs_promtool():
    pytest.skip("promtool not found")

@pytest.mark.gpu
@pytest.mark.vllm
def test_full_size():
    pass

def test_plain():
    pytest.skip("optional extra")
"""


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini(MARKERS)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def _run(suite, monkeypatch, *args, **flags):
    for flag in ("DEEPINFER_REQUIRE_VLLM", "DEEPINFER_REQUIRE_TOOLS", "DEEPINFER_TEST_DEVICE"):
        monkeypatch.delenv(flag, raising=False)
    for flag, value in flags.items():
        monkeypatch.setenv(flag, value)
    return suite.runpytest_inprocess("-rA", *args)


def test_without_flags_skips_stay_skips(suite, monkeypatch):
    result = _run(suite, monkeypatch)
    result.assert_outcomes(skipped=5)
    result.stdout.fnmatch_lines(["*tiers*", "*required: none", "*vllm   DID NOT RUN: 3 skipped"])


def test_the_summary_counts_what_pytest_xdist_workers_ran(suite, monkeypatch):
    """make test runs on two xdist workers: the controller prints the summary from their
    reports, and a required tier's skip still fails there."""
    # The workers are new interpreters: they find tools/ through PYTHONPATH.
    root = str(Path(__file__).resolve().parents[2])
    paths = (root, os.environ.get("PYTHONPATH"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    result = _run(suite, monkeypatch, "-n", "2", DEEPINFER_REQUIRE_VLLM="1")
    result.assert_outcomes(failed=1, skipped=4)
    result.stdout.fnmatch_lines(
        [
            "*test_needs_vllm: skipped, but DEEPINFER_REQUIRE_VLLM=1 requires it*",
            "*tiers*",
            "*required: DEEPINFER_REQUIRE_VLLM=1",
            "*gpu    DID NOT RUN: 1 skipped",
            "*vllm   ran: 1 failed, 2 skipped",
            "*tools  DID NOT RUN: 1 skipped",
            "*plain  DID NOT RUN: 1 skipped",
        ]
    )


def test_require_vllm_fails_a_skipped_vllm_test_and_names_it(suite, monkeypatch):
    result = _run(suite, monkeypatch, DEEPINFER_REQUIRE_VLLM="1")
    result.assert_outcomes(failed=1, skipped=4)
    result.stdout.fnmatch_lines(
        [
            "*test_suite.py::test_needs_vllm: skipped, but DEEPINFER_REQUIRE_VLLM=1 requires it:"
            " Skipped: vllm.fake is missing*",
            "*required: DEEPINFER_REQUIRE_VLLM=1",
        ]
    )
    # not applicable on this hardware, and the gpu tier not running: still skips
    assert "test_wrong_gpu: skipped, but" not in result.stdout.str()
    assert "test_full_size: skipped, but" not in result.stdout.str()


def test_require_tools_fails_a_skipped_tools_test(suite, monkeypatch):
    result = _run(suite, monkeypatch, DEEPINFER_REQUIRE_TOOLS="1")
    result.assert_outcomes(failed=1, skipped=4)
    result.stdout.fnmatch_lines(["*test_needs_promtool: skipped, but DEEPINFER_REQUIRE_TOOLS=1*"])


def test_import_or_skip_is_a_collection_error_when_required(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makeini(MARKERS)
    pytester.makepyfile(
        test_mod="""
from tools.tiers import import_or_skip
import_or_skip("vllm_no_such_module")

def test_x():
    pass
"""
    )
    monkeypatch.delenv("DEEPINFER_REQUIRE_VLLM", raising=False)
    pytester.runpytest_inprocess().assert_outcomes(skipped=1)
    monkeypatch.setenv("DEEPINFER_REQUIRE_VLLM", "1")
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*vllm_no_such_module cannot be imported and DEEPINFER_REQUIRE_VLLM=1 requires it*"]
    )


DEVICE_SUITE = """
import pytest

def test_builds_cpu_tensors():
    pass

def test_takes_the_device(device):
    assert device.type == "cuda"

@pytest.mark.gpu
def test_full_size():
    pass
"""


def test_on_the_gpu_the_cpu_tier_tests_are_left_out_and_counted(pytester, monkeypatch):
    """With DEEPINFER_TEST_DEVICE=cuda the interpreter is off: a test that neither is
    gpu-marked nor takes ``device`` would hand CPU tensors to a Triton kernel, so the GPU
    tier leaves it to ``make test`` and says how many it left."""
    import torch

    pytester.makeconftest(CONFTEST)
    pytester.makeini(MARKERS)
    pytester.makepyfile(test_suite=DEVICE_SUITE)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # no GPU is touched
    for flag in ("DEEPINFER_REQUIRE_VLLM", "DEEPINFER_REQUIRE_TOOLS", "DEEPINFER_AMPERE_PTX"):
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setenv("DEEPINFER_TEST_DEVICE", "cuda")
    result = pytester.runpytest_inprocess("-rA")
    result.assert_outcomes(passed=2, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "*device: cuda*",
            "*left to the CPU tiers (make test): 1 tests that neither are gpu-marked nor take"
            " the device fixture",
            "PASSED test_suite.py::test_takes_the_device",
            "PASSED test_suite.py::test_full_size",
        ]
    )
    monkeypatch.setenv("DEEPINFER_TEST_DEVICE", "cpu")
    pytester.runpytest_inprocess().assert_outcomes(passed=1, skipped=1, failed=1)
