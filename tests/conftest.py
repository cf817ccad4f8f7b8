"""Test tiers and shared fixtures.

Without a usable CUDA device (or with ``DEEPINFER_TEST_DEVICE=cpu``) the kernels run
under Triton's interpreter on CPU tensors: ``TRITON_INTERPRET=1`` and
``CUDA_VISIBLE_DEVICES=`` (set, empty, which also lets vLLM's Triton kernels run as
oracles) must be in place before Triton is imported, hence at the top of this file.
``make test-gpu`` sets ``DEEPINFER_TEST_DEVICE=cuda``: kernels compile for the GPU and
the ``gpu``-marked full-size cases run, with every test that takes the ``device`` fixture;
the rest belong to the CPU tiers and are deselected there (the tiers summary counts them).

Required tiers (``tools/tiers.py``): under ``DEEPINFER_REQUIRE_VLLM=1``
a skipped ``vllm`` test, and under ``DEEPINFER_REQUIRE_TOOLS=1`` a skipped ``tools`` test,
is reported as a failure. The run ends with a "tiers" section: what each tier ran.
"""

import os

_WANT = os.environ.get("DEEPINFER_TEST_DEVICE", "").lower()
if _WANT != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import pytest
import torch

from tools import tiers

ON_GPU = _WANT == "cuda"
if ON_GPU and not torch.cuda.is_available():
    raise RuntimeError(
        "DEEPINFER_TEST_DEVICE=cuda but torch sees no CUDA device; run `make test` for the "
        "CPU tiers"
    )
if ON_GPU:
    from tools import ampere_ptx

    ampere_ptx.enable_if_requested()  # DEEPINFER_AMPERE_PTX=1: Ampere lowering via PTX JIT


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if ON_GPU else "cpu")


def gpu_marked(item) -> bool:
    """Marked ``gpu`` (itself, its class or its module). Not ``"gpu" in item.keywords``:
    keywords also hold parameter ids and node names, so a case parametrized with the
    value ``"gpu"`` would count."""
    return item.get_closest_marker("gpu") is not None


def runs_on_the_device(item) -> bool:
    """A test the GPU tier runs: ``gpu``-marked, or taking the ``device`` fixture. Every
    other test belongs to the CPU tiers: it builds CPU tensors for the Triton interpreter
    (vLLM's Triton kernels as oracles among them) or needs nothing of a GPU, and ``make
    test`` runs it."""
    return gpu_marked(item) or "device" in getattr(item, "fixturenames", ())


_left_to_the_cpu_tiers: list[str] = []


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="full-size case: needs DEEPINFER_TEST_DEVICE=cuda")
    for item in items:
        if gpu_marked(item) and not ON_GPU:
            item.add_marker(skip_gpu)
    if ON_GPU:
        # On the GPU, TRITON_INTERPRET is off, so a CPU-tier test that hands CPU tensors
        # to a Triton kernel fails for a reason that says nothing about the kernels.
        cpu_only = [item for item in items if not runs_on_the_device(item)]
        if cpu_only:
            _left_to_the_cpu_tiers.extend(item.nodeid for item in cpu_only)
            config.hook.pytest_deselected(items=cpu_only)
            items[:] = [item for item in items if runs_on_the_device(item)]


# ------------------------------------------------------------------ required tiers

TIER_MARKERS = ("gpu", "vllm", "aot", "tools", "image")
_outcomes: dict[str, tuple[tuple[str, ...], str]] = {}  # nodeid -> (tiers, outcome)


def _tiers(item) -> tuple[str, ...]:
    return tuple(m for m in TIER_MARKERS if item.get_closest_marker(m)) or ("plain",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip of a test in a required tier (tools/tiers.py) becomes a failure naming
    the test, the flag and the skip's reason; every test's outcome is kept for the
    summary of tiers below."""
    report = (yield).get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        flag = tiers.required_flag({m.name for m in item.iter_markers()})
        tier_not_running = gpu_marked(item) and not ON_GPU
        if flag and not tier_not_running and not tiers.is_not_applicable(reason):
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid}: skipped, but {flag}=1 requires it: {reason}"
    # The tiers travel on the report: under pytest-xdist (make test) the workers run the
    # tests and the controller, which prints the summary, sees only their reports.
    report.user_properties.append(("tiers", _tiers(item)))


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        tier_names = dict(report.user_properties).get("tiers", ("plain",))
        _outcomes[report.nodeid] = (tuple(tier_names), report.outcome)


def pytest_terminal_summary(terminalreporter):
    """Which tiers ran, and how: a tier whose tests all skipped did not run."""
    if not _outcomes:
        return
    counts: dict[str, dict[str, int]] = {}
    for tier_names, outcome in _outcomes.values():
        for tier in tier_names:
            counts.setdefault(tier, {}).setdefault(outcome, 0)
            counts[tier][outcome] += 1
    required = [f"{flag}=1" for flag in tiers.REQUIRE_FLAGS.values() if os.environ.get(flag) == "1"]
    terminalreporter.section("tiers")
    terminalreporter.write_line(
        f"device: {'cuda' if ON_GPU else 'cpu (Triton interpreter)'}; required: "
        f"{', '.join(required) or 'none'}"
    )
    if _left_to_the_cpu_tiers:
        terminalreporter.write_line(
            f"  left to the CPU tiers (make test): {len(_left_to_the_cpu_tiers)} tests that "
            "neither are gpu-marked nor take the device fixture"
        )
    for tier in (*TIER_MARKERS, "plain"):
        if tier in counts:
            c = counts[tier]
            ran = "ran" if c.get("passed", 0) + c.get("failed", 0) else "DID NOT RUN"
            parts = ", ".join(f"{n} {o}" for o, n in sorted(c.items()))
            terminalreporter.write_line(f"  {tier:6s} {ran}: {parts}")
