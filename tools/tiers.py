"""Required test tiers: what a tier needs and is missing is a failure, never a silent skip.

A tier is a pytest marker. ``DEEPINFER_REQUIRE_VLLM=1`` (``make test``) makes every
``vllm``-marked test required; ``DEEPINFER_REQUIRE_TOOLS=1`` (CI) every ``tools``-marked
one (tests that run an external program: promtool, prometheus). ``tests/conftest.py``
turns a skip of a required test into a failure naming the test and the skip's reason.

Two skips stay skips: a tier that is not running (``gpu`` tests without a GPU), and a
test that does not apply to the hardware at hand (``skip_not_applicable``: e.g. vLLM's
fp8 kernels on a GPU older than sm_89), which no installed package could change.
"""

import importlib
import os

REQUIRE_FLAGS = {"vllm": "DEEPINFER_REQUIRE_VLLM", "tools": "DEEPINFER_REQUIRE_TOOLS"}
NOT_APPLICABLE = "not applicable here: "


def required_flag(markers) -> str | None:
    """The set ``DEEPINFER_REQUIRE_*`` flag that makes a test with ``markers`` required."""
    for marker, flag in REQUIRE_FLAGS.items():
        if marker in markers and os.environ.get(flag) == "1":
            return flag
    return None


def import_or_skip(name: str, flag: str = "DEEPINFER_REQUIRE_VLLM"):
    """``import name``; where it fails, a skip, or under ``flag=1`` a failure (at module
    level: a collection error) that names the module and the flag."""
    import pytest

    if os.environ.get(flag) == "1":
        try:
            return importlib.import_module(name)
        except ImportError as err:
            pytest.fail(f"{name} cannot be imported and {flag}=1 requires it: {err}", pytrace=False)
    return pytest.importorskip(name, reason=f"{name} is not importable ({flag}=1 makes this fail)")


def skip_not_applicable(reason: str):
    """Skip a test that cannot apply on this machine whatever is installed (a hardware
    limit); required tiers let this skip stand."""
    import pytest

    pytest.skip(NOT_APPLICABLE + reason)


def is_not_applicable(reason: str) -> bool:
    return NOT_APPLICABLE in reason
