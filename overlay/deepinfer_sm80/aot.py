"""Ahead-of-time Ampere kernels, shipped in the image: one command builds them all.

``build`` compiles, on a machine without a GPU, every kernel config a server launches for
sm_80 and sm_86, checks each against the Ampere budget (shared memory, registers, no
spills) and fails naming every one that does not fit. The image does this at build time
(docker/Dockerfile), into ``DEEPINFER_AOT_DIR``::

    DEST/manifest.json, DEST/triton/                the Triton specs (``ops.registry``)
    DEST/mhc/manifest.json, DEST/mhc/tilelang/      the mHC TileLang variants
    DEST/sparse_mla/manifest.json, .../tilelang/    the sparse MLA TileLang variants
    DEST/vllm_mhc/manifest.json, .../tilelang/      vLLM's mHC pre-norm kernels: the
                                                    epilogue's JIT-warmup keys and, below
                                                    sm_90, the projection GEMM's
                                                    (``vllm_mhc_aot``)

Each ``tilelang/`` folder is a TileLang cache folder (``tilelang_build.aot_build``). At
startup the plugin's activation (``vllm_plugin.apply.seed_aot_kernels``, in every vLLM
process, before vLLM's profiling run launches a kernel) copies ``triton/`` into the
writable Triton cache (``seed``) and the TileLang folders into the live TileLang cache
(``tilelang_build.seed_tilelang_cache``); our kernel warmup and vLLM's JIT warmup then load
them.

What the Triton entries buy, and their limit: Triton looks a kernel up by a hash of its
source, the target, the launch options, the argument specialization (which integer
arguments are divisible by 16, which pointers are aligned) and its own build
(``triton_key()``: Triton's sources and compiled library, which differ between the
wheels of one Triton version for two Python versions). The build compiles each spec
through Triton's launcher (``triton_launch_compile``), so an entry is the one a runtime
launch with the spec's argument properties looks up; any other launch JIT-compiles as it
would without the cache. The manifest records the Triton build (``triton_build``), and
``seed`` refuses entries of another build: no launch of this process could find them.
Whether a server's launches specialize as the specs say shows in its Triton cache after a
run: ``python -m deepinfer_sm80.triton_cache_audit CACHE --aot DEST`` names each of our
kernels it compiled and the spec change that would cover it.
TileLang entries are keyed by the kernel's TIR, target, backend and pass configs, all
pinned in ``tilelang_build`` (for vLLM's kernels, as vLLM sets them on CUDA:
``vllm_mhc_aot``), so a server on that architecture finds them.

    python -m deepinfer_sm80.aot build /opt/deepinfer/kernels --arches "8.0 8.6"
    python -m deepinfer_sm80.aot seed /opt/deepinfer/kernels ~/.cache/triton

``--hopper-proxy`` also accepts ``--arches 9.0``: the same kernels, configs and pass
configs built for sm_90, for an H100/H200 that runs the Ampere kernels with the plugin
forced on (``DEEPINFER_FORCE=1``), as the end-to-end comparison does. A server there then
starts from an AOT folder as an Ampere server does from the image's, so its start time
can be measured with the cache. The fit check still holds them to the Ampere budget.
Such a folder's manifests say ``"hopper_proxy": true``; it is never an Ampere build. Like
an Ampere folder it builds on a machine without a GPU (vLLM's warmup keys are asked for,
and its kernels elaborated with PDL, as on the server's GPU: ``vllm_mhc_aot``), with the
Python and Triton of the servers that will load it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

from deepinfer_sm80.arch import HOPPER_PROXY_CC, parse_ampere_arches
from deepinfer_sm80.triton_launch_compile import build_id

MANIFEST = "manifest.json"
TRITON_SUBDIR = "triton"
# The TileLang ops' AOT folders inside DEST (DEEPINFER_AOT_DIR), read back by the
# plugin's kernel warmup.
MHC_SUBDIR = "mhc"
SPARSE_MLA_SUBDIR = "sparse_mla"
# vLLM's own mHC pre-norm kernels (deepinfer_sm80.vllm_mhc_aot), which DeepSeek-V4.1 still runs.
VLLM_MHC_SUBDIR = "vllm_mhc"
# The token budget the mHC variants are built for (vLLM's max_num_batched_tokens; every
# budget from ops.mhc.geometry.TC_MIN_TOKENS up needs the same variants).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def _proxy_field(ccs: list[int]) -> dict:
    """``{"hopper_proxy": True}`` for a build that includes sm_90, else nothing."""
    return {"hopper_proxy": True} if HOPPER_PROXY_CC in ccs else {}


def build_triton(dest: Path, ccs: list[int]) -> dict:
    """Compile every shipped Triton spec for ``ccs`` into ``dest``; raise if any fails to fit."""
    from deepinfer_sm80.ampere_fit import compile_for_ampere, fit_violations
    from deepinfer_sm80.ops.registry import all_ampere_kernel_specs

    cache = dest / TRITON_SUBDIR
    cache.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # the compile subprocess inherits it
    try:
        reports = compile_for_ampere(all_ampere_kernel_specs(), ccs)
    finally:
        if previous is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = previous
    problems = fit_violations(reports)
    if problems:
        raise RuntimeError("AOT kernels do not fit Ampere:\n" + "\n".join(problems))
    manifest = {
        "arches": [f"sm_{cc}" for cc in ccs],
        **_proxy_field(ccs),
        # the compile subprocess runs this interpreter, so this process's Triton build
        "triton_build": build_id(),
        "kernels": [asdict(r) for r in reports],
        "entries": sorted(p.name for p in cache.iterdir()),
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def build_mhc(
    dest: Path,
    ccs: list[int],
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    log=print,
) -> dict:
    """The mHC variants a server with this token budget launches (DeepSeek-V4.1-Flash's
    constants), into ``dest``; the manifest records the budget and the constants."""
    from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig, shipped_variants
    from deepinfer_sm80.tilelang_build import aot_build

    model = MhcModelConfig()
    return aot_build(
        dest,
        shipped_variants(max_num_batched_tokens, model),
        ccs,
        "mHC",
        log,
        max_num_batched_tokens=max_num_batched_tokens,
        model=asdict(model),
        **_proxy_field(ccs),
    )


def build_sparse_mla(dest: Path, ccs: list[int], log=print) -> dict:
    """The sparse MLA TileLang variants (decode and prefill) a server launches, into ``dest``."""
    from deepinfer_sm80.ops.sparse_mla.tilelang_kernels import shipped_variants
    from deepinfer_sm80.tilelang_build import aot_build

    return aot_build(dest, shipped_variants(), ccs, "sparse MLA", log, **_proxy_field(ccs))


def build_vllm_mhc(
    dest: Path,
    ccs: list[int],
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    log=print,
) -> dict:
    """vLLM's mHC pre-norm kernels for ``ccs`` into ``dest``: the epilogue for every key
    its JIT warmup asks for and, where one of ``ccs`` lacks DeepGEMM, the projection GEMM
    for every token-count class (``vllm_mhc_aot.shipped_variants``)."""
    import vllm

    from deepinfer_sm80 import vllm_mhc_aot
    from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig
    from deepinfer_sm80.tilelang_build import aot_build

    model = MhcModelConfig()
    return aot_build(
        dest,
        vllm_mhc_aot.shipped_variants(model, max_num_batched_tokens, tuple(ccs)),
        ccs,
        "vLLM mHC",
        log,
        vllm=vllm.__version__,
        max_num_batched_tokens=max_num_batched_tokens,
        model=asdict(model),
        **_proxy_field(ccs),
    )


PARTS = ("triton", "mhc", "sparse_mla", "vllm_mhc")


def build_part(part: str, dest: Path, ccs: list[int], max_num_batched_tokens: int, log=print):
    """One part of ``build`` into its place inside ``dest``; returns its manifest."""
    if part == "triton":
        return build_triton(dest, ccs)
    if part == "mhc":
        return build_mhc(dest / MHC_SUBDIR, ccs, max_num_batched_tokens, log)
    if part == "sparse_mla":
        return build_sparse_mla(dest / SPARSE_MLA_SUBDIR, ccs, log)
    if part == "vllm_mhc":
        return build_vllm_mhc(dest / VLLM_MHC_SUBDIR, ccs, max_num_batched_tokens, log)
    raise ValueError(f"unknown AOT part {part!r}; expected one of {PARTS}")


def build(
    dest: Path,
    ccs: list[int],
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    log=print,
    jobs: int = 1,
) -> dict[str, dict]:
    """Every shipped kernel for ``ccs`` into ``dest`` (layout in the module docstring):
    the Triton specs, the mHC and sparse MLA TileLang variants, vLLM's mHC pre-norm keys.
    Returns each part's manifest; raises at the first part with a kernel that does not fit
    Ampere. With ``jobs`` > 1 the parts build in that many forked processes at once (each
    part writes only its own files; their logs go to stdout), and the first failing part
    in ``PARTS`` order raises once all have ended."""
    if max_num_batched_tokens < 1:
        raise ValueError(f"--max-num-batched-tokens: expected >= 1, got {max_num_batched_tokens}")
    if jobs < 1:
        raise ValueError(f"--jobs: expected >= 1, got {jobs}")
    dest = Path(dest)
    if jobs == 1:
        return {part: build_part(part, dest, ccs, max_num_batched_tokens, log) for part in PARTS}
    # Fork, not spawn: nothing here has touched a GPU yet, and the children see this
    # process's state as it is (a test's cut-down kernel lists included).
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(jobs, len(PARTS)), mp_context=context) as pool:
        futures = {
            part: pool.submit(build_part, part, dest, ccs, max_num_batched_tokens) for part in PARTS
        }
        outcomes = {}
        for part, future in futures.items():
            try:
                outcomes[part] = future.result()
            except Exception as exc:  # noqa: BLE001 -- raised below, after every part ended
                outcomes[part] = exc
    for outcome in outcomes.values():
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


def tilelang_aot_dir(aot_dir: str | Path | None, subdir: str) -> Path | None:
    """Where ``build`` put one TileLang op's kernels inside ``aot_dir``
    (``DEEPINFER_AOT_DIR``); None when there is no AOT folder."""
    return Path(aot_dir) / subdir if aot_dir else None


class ForeignTritonBuildError(ValueError):
    """An AOT folder's Triton entries come from another Triton build than this process's."""


def check_triton_build(src: Path) -> None:
    """Raise ``ForeignTritonBuildError`` unless ``src``'s Triton entries were compiled by this
    process's Triton build (version, Python version, ``triton_key()``)."""
    path = src / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ForeignTritonBuildError(f"{path}: unreadable ({exc}); rebuild the folder") from exc
    built, here = manifest.get("triton_build"), build_id()
    if built != here:
        raise ForeignTritonBuildError(
            f"{src}: its Triton entries were compiled by {_describe(built)}, this process "
            f"runs {_describe(here)}; no launch here would find them. Rebuild the folder "
            f"with this interpreter: {_rebuild_command(src, manifest)}"
        )


def _rebuild_command(src: Path, manifest: dict) -> str:
    """The build command that makes ``src`` again for the arches its manifest lists."""
    arches = " ".join(f"{a[3]}.{a[4:]}" for a in manifest.get("arches", [])) or "8.0 8.6"
    proxy = " --hopper-proxy" if manifest.get("hopper_proxy") else ""
    return f'{sys.executable} -m deepinfer_sm80.aot build {src} --arches "{arches}"{proxy}'


def _describe(build: dict | None) -> str:
    if not build:
        return "a build that recorded no triton_build (an older deepinfer_sm80.aot)"
    return (
        f"Triton {build.get('triton')} for Python {build.get('python')} "
        f"(triton_key sha256 {str(build.get('triton_key_sha256'))[:12]})"
    )


def seed(src: Path, triton_cache: Path) -> int:
    """Copy AOT cache entries missing from ``triton_cache``; returns how many were copied.

    Never overwrites: an entry already there was compiled by this Triton on this host.
    Raises ``ForeignTritonBuildError`` for entries of another Triton build (``check_triton_build``).
    """
    cache = src / TRITON_SUBDIR
    if not cache.is_dir():
        return 0
    check_triton_build(src)
    triton_cache.mkdir(parents=True, exist_ok=True)
    copied = 0
    for entry in cache.iterdir():
        target = triton_cache / entry.name
        if target.exists():
            continue
        tmp = triton_cache / f".{entry.name}.seeding-{os.getpid()}"  # one per process
        shutil.copytree(entry, tmp, dirs_exist_ok=True)
        try:
            os.replace(tmp, target)  # atomic: concurrent workers never see half an entry
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another worker seeded it first
            continue
        copied += 1
    return copied


def default_triton_cache() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deepinfer_sm80.aot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile every shipped kernel for Ampere into DEST")
    b.add_argument("dest", type=Path)
    b.add_argument("--arches", default="8.0 8.6", help='compute capabilities, e.g. "8.0 8.6"')
    b.add_argument(
        "--hopper-proxy",
        action="store_true",
        help="also accept 9.0: the Ampere kernels for an H100/H200 forced onto them",
    )
    b.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help="the token budget the mHC variants are built for (default %(default)s)",
    )
    b.add_argument(
        "--jobs",
        type=int,
        default=1,
        help=f"build the {len(PARTS)} parts in up to this many processes at once "
        "(default %(default)s)",
    )
    s = sub.add_parser("seed", help="copy AOT entries from SRC into a Triton cache")
    s.add_argument("src", type=Path)
    s.add_argument("triton_cache", type=Path, nargs="?", default=None)
    args = parser.parse_args(argv)
    if args.cmd == "build":
        try:
            manifests = build(
                args.dest,
                parse_ampere_arches(args.arches, args.hopper_proxy),
                args.max_num_batched_tokens,
                jobs=args.jobs,
            )
        except (ValueError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for part, manifest in manifests.items():
            entries = manifest.get("entries")
            print(
                f"{args.dest}: {part}: {len(manifest['kernels'])} kernel builds for "
                f"{', '.join(manifest['arches'])}"
                + (f", {len(entries)} cache entries" if entries is not None else "")
            )
        return 0
    try:
        n = seed(args.src, args.triton_cache or default_triton_cache())
    except ForeignTritonBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"seeded {n} Triton cache entries from {args.src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
