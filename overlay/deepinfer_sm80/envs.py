"""Every environment variable the overlay reads: one entry each, with its default, its
values, its meaning and the component that reads it, plus the accessors the runtime reads
them through. README.md's environment table is generated from ``REGISTRY``
(``markdown_table``), so the two cannot drift, and each default is written here only:
the accessors return it for an unset or empty variable. Standard library only: ``deploy/``
imports this module and never imports torch or vLLM."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Components, as the table names them.
OPS = "ops"
PLUGIN = "vllm_plugin"
DEPLOY = "deploy"
TESTS = "tests"
TOOLS = "tools"
IMAGE = "image"

# A name that modules on both sides of the torch boundary spell (deploy/ sets it, the
# sparse-MLA kernels read it): defined here once, for both to import.
DECODE_SPLITS_ENV = "DEEPINFER_SPARSE_MLA_DECODE_SPLITS"


def _runtime_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "deepinfer")


def _config_dir() -> str:
    # configs/ sits beside overlay/ in the repository and in the image (/opt/deepinfer);
    # this file is overlay/deepinfer_sm80/envs.py.
    return str(Path(__file__).resolve().parents[2] / "configs")


@dataclass(frozen=True)
class Var:
    """One variable. ``kind``: ``flag`` (``1`` turns on a default-off switch, ``0`` turns
    off a default-on one), ``choice`` (one of ``choices``, case and spaces ignored), ``str``
    (free text), ``path`` or ``list`` (comma-separated names). ``default`` is the value an
    unset or empty variable means, as the table shows it (None: no default, the reader
    decides). ``computed_default``: for a default known only when read (a folder), the
    function that gives it; ``default`` then describes it."""

    name: str
    kind: str
    default: str | None
    readers: tuple[str, ...]
    meaning: str
    choices: tuple[str, ...] = ()
    hint: str = ""
    computed_default: Callable[[], str] | None = None


REGISTRY: tuple[Var, ...] = (
    Var("DEEPINFER_FORCE", "flag", "0", (PLUGIN,),
        "activate on non-SM8x GPUs (or none) to exercise the Ampere paths"),
    Var("DEEPINFER_DISABLE", "flag", "0", (PLUGIN,), "never activate"),
    Var("DEEPINFER_PATCHES", "list", "", (PLUGIN,),
        "apply only these ledger entries, e.g. `a,b` (`deepinfer doctor --patches` lists "
        "them; empty: all)"),
    Var("DEEPINFER_PP_RELAY", "flag", "0", (DEPLOY, PLUGIN),
        "use the pipeline relay for cuts inside sharing groups (`tp2-pp3`, `pp6`): not run "
        "across pipeline stages on GPUs"),
    Var("DEEPINFER_ALLOW_VLLM_VERSION", "flag", "0", (PLUGIN,),
        "accept a vLLM other than 0.33.0"),
    Var("DEEPINFER_RUNTIME_DIR", "path", "$TMPDIR/deepinfer", (PLUGIN, DEPLOY),
        "where `plugin-status.json` is written (plugin) and read (`deepinfer doctor`)",
        computed_default=_runtime_dir),
    Var("DEEPINFER_CONFIG_DIR", "path", "configs/ beside overlay/", (DEPLOY,),
        "the configs folder `deepinfer` reads", computed_default=_config_dir),
    Var("DEEPINFER_URL", "str", "http://127.0.0.1:8000", (DEPLOY,),
        "the server `deepinfer health` checks"),
    Var("DEEPINFER_SERVED_MODEL_NAME", "str", "deepseek-v4.1-flash", (DEPLOY,),
        "the model name `deepinfer health` asks for"),
    Var("VLLM_API_KEY", "str", None, (DEPLOY,),
        "API key of vLLM and `deepinfer health` (kept out of argv)"),
    Var("DEEPINFER_YOCO", "flag", "1", (PLUGIN,),
        "`0` turns off the per-step index-metadata reuse across a KV-sharing group"),
    Var("DEEPINFER_SPARSE_MLA_DECODE", "choice", "auto", (OPS,),
        "which decode kernels run: `auto` takes the TileLang kernels on a CUDA GPU of "
        "compute capability 8.0+ with TileLang installed, else Triton (with a warning on a "
        "GPU); a forced engine that cannot run is refused with the reason",
        choices=("auto", "tilelang", "triton")),
    Var("DEEPINFER_SPARSE_MLA_PREFILL", "choice", "auto", (OPS,),
        "which prefill kernels run, chosen as for `DEEPINFER_SPARSE_MLA_DECODE`",
        choices=("auto", "tilelang", "triton")),
    Var(DECODE_SPLITS_ENV, "choice", "latency", (OPS, DEPLOY),
        "one split per token (`throughput`) or several (`latency`); the launcher sets it "
        "from the topology's `decode_splits` (see Serve)",
        choices=("latency", "throughput"),
        hint=" (latency: several splits per token, for small batches; throughput: one split "
        "per token, for large batches); a server sets it from its topology's decode_splits"),
    Var("DEEPINFER_AOT_DIR", "path", None, (PLUGIN, IMAGE),
        "ahead-of-time Triton, mHC and sparse MLA kernels and vLLM's mHC pre-norm kernels to "
        "seed the caches from (`/opt/deepinfer/kernels` in the image)"),
    Var("DEEPINFER_PUBLISHED_HOST", "str", None, (DEPLOY,),
        "the host address `deepinfer launch`'s port is published on (compose.yaml passes "
        "`BIND_ADDRESS`); beyond loopback a key is required. Unset: the listen address "
        "decides"),
    Var("DEEPINFER_ALLOW_UNAUTHENTICATED", "flag", "0", (DEPLOY,),
        "`deepinfer launch` and the router serve beyond loopback without `VLLM_API_KEY` on "
        "purpose (`0`: refused)",
        choices=("0", "1")),
    Var("DEEPINFER_LISTEN_HOST", "str", None, (DEPLOY,),
        "where vLLM listens, in place of the topology's `host` (`--listen-host`): 0.0.0.0 "
        "in compose.yaml's container, `BIND_ADDRESS` with host networking "
        "(compose.multinode.yaml)"),
    Var("NODE_RANK", "str", "0", (DEPLOY,),
        "this node's rank in a multi-node topology (per-node `.env`)"),
    Var("MASTER_ADDR", "str", None, (DEPLOY,),
        "node 0's address in a multi-node topology (per-node `.env`)"),
    Var("VLLM_HOST_IP", "str", None, (DEPLOY,),
        "this node's address in a multi-node topology (per-node `.env`)"),
    Var("DEEPINFER_EXPECT_CONFIG_HASH", "str", None, (DEPLOY,),
        "node 0's config hash: a node rendering another command refuses to start"),
    Var("DEEPINFER_TEST_DEVICE", "choice", None, (TESTS,),
        "`cuda` runs the GPU tier (`make test-gpu` sets it); unset: the CPU tiers",
        choices=("cuda",)),
    Var("DEEPINFER_AMPERE_PTX", "flag", "0", (TESTS, TOOLS),
        "on a newer GPU, GPU tests and benchmarks build Triton kernels through Triton's "
        "sm_80 pipeline and load them as PTX (`tools/ampere_ptx.py`); results are filed "
        "under their own key"),
    Var("DEEPINFER_REQUIRE_VLLM", "flag", "0", (TESTS,),
        "fail, not skip, the `vllm`-marked tests when vLLM is missing (`make test` sets it)"),
    Var("DEEPINFER_REQUIRE_TOOLS", "flag", "0", (TESTS,),
        "fail, not skip, when `promtool`/`prometheus` are missing (CI sets it)"),
    Var("DEEPINFER_UPDATE_GOLDEN", "flag", "0", (TESTS,),
        "rewrite the golden launch commands of `tests/deploy/test_multinode.py` instead of "
        "comparing against them"),
    Var("DEEPINFER_ORACLE_RECORD", "path", None, (TESTS,),
        "a JSON-lines file the GPU oracle tests (`tests/ops/test_gpu_oracles.py`) append "
        "each comparison's figures to (`scripts/e2e-on-device` sets it; "
        "`benchmarks/oracle_summary.py` tabulates it); unset: printed only"),
    Var("DEEPINFER_COVERAGE_REPORT", "path", None, (TESTS,),
        "where `tests/tools/test_sm80_coverage.py` writes the sm_80 coverage list as JSON "
        "(a folder: `coverage.json` in it); unset: pytest's cache folder"),
)  # fmt: skip

BY_NAME: dict[str, Var] = {v.name: v for v in REGISTRY}


def spec(name: str) -> Var:
    """The entry for ``name``; an unregistered name is a programming error."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not in deepinfer_sm80.envs.REGISTRY; register it") from None


_REGISTERED = object()  # get's default: the registry's


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    spec(name)
    return (os.environ if environ is None else environ).get(name)


def get(name: str, environ: Mapping[str, str] | None = None, default=_REGISTERED):
    """The value of a registered variable, exactly as set. Unset or empty: ``default``
    when given, else the registered default (computed where the entry says how; None
    where it has none). ``environ``: the mapping to read (default: this process's
    environment)."""
    value = _raw(name, environ)
    if value:
        return value
    if default is not _REGISTERED:
        return default
    var = spec(name)
    return var.computed_default() if var.computed_default else var.default


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """A switch. Default off: on only for exactly ``1``. Default on: off only for ``0``
    (spaces ignored), so an unset or empty variable keeps the default."""
    var = spec(name)
    if var.kind != "flag":
        raise TypeError(f"{name} is a {var.kind}, not a flag")
    value = _raw(name, environ)
    if var.default == "1":
        return value is None or value.strip() != "0"
    return value == "1"


def choice(name: str, environ: Mapping[str, str] | None = None) -> str:
    """One of the variable's ``choices`` (lowercased, spaces stripped; unset or empty: the
    default). Anything else raises ValueError naming the variable and the allowed values."""
    var = spec(name)
    if var.kind != "choice":
        raise TypeError(f"{name} is a {var.kind}, not a choice")
    value = (_raw(name, environ) or "").strip().lower() or var.default
    if value not in var.choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(var.choices)}{var.hint}")
    return value


def _values(var: Var) -> str:
    if var.choices:
        shown = "/".join(f"`{c}`" for c in var.choices)
    elif var.kind == "flag":
        shown = "`1`" if var.default == "0" else "`0`"
    else:
        shown = var.kind
    if var.default is None:
        return f"{shown}, unset by default"
    return f"{shown}, default `{var.default}`" if var.default else f"{shown}, default empty"


def markdown_table() -> str:
    """README.md's environment-variable table, one row per registry entry."""
    rows = [
        "| variable | values | read by | meaning |",
        "|---|---|---|---|",
    ]
    for var in REGISTRY:
        readers = ", ".join(var.readers)
        rows.append(f"| `{var.name}` | {_values(var)} | {readers} | {var.meaning} |")
    return "\n".join(rows) + "\n"


__all__ = [
    "BY_NAME",
    "DECODE_SPLITS_ENV",
    "REGISTRY",
    "Var",
    "choice",
    "flag",
    "get",
    "markdown_table",
    "spec",
]
