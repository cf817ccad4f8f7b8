"""Ahead-of-time Triton kernels for Ampere, shipped in the image.

``build`` compiles every shipped kernel config (``ops.registry``) for sm_80 and sm_86 on
a machine without a GPU, into a Triton cache folder plus ``manifest.json``; the image
does this at build time (docker/Dockerfile). ``seed`` copies those cache entries into
the server's writable Triton cache before the first launch; the plugin calls it.

What this buys, and its limit: Triton looks a kernel up by a hash of its source, the
target, the launch options and the argument specialization (which integer arguments are
divisible by 16, which pointers are aligned). An entry is reused only when the runtime
launch specializes exactly like the AOT spec; any other launch JIT-compiles as it would
without the cache. Whether the runtime hits these entries can only be observed on an
Ampere GPU, which this project has not had yet: the manifest lists what was compiled so a
user can compare it with Triton's cache after a run.

    python -m deepinfer_sm80.aot build /opt/deepinfer/kernels --arches "8.0 8.6"
    python -m deepinfer_sm80.aot seed /opt/deepinfer/kernels ~/.cache/triton
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from deepinfer_sm80.arch import parse_ampere_arches

MANIFEST = "manifest.json"
TRITON_SUBDIR = "triton"


def build(dest: Path, ccs: list[int]) -> dict:
    """Compile every shipped spec for ``ccs`` into ``dest``; raise if any fails to fit."""
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
        "kernels": [asdict(r) for r in reports],
        "entries": sorted(p.name for p in cache.iterdir()),
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def seed(src: Path, triton_cache: Path) -> int:
    """Copy AOT cache entries missing from ``triton_cache``; returns how many were copied.

    Never overwrites: an entry already there was compiled by this Triton on this host.
    """
    cache = src / TRITON_SUBDIR
    if not cache.is_dir():
        return 0
    triton_cache.mkdir(parents=True, exist_ok=True)
    copied = 0
    for entry in cache.iterdir():
        target = triton_cache / entry.name
        if target.exists():
            continue
        tmp = triton_cache / f".{entry.name}.seeding"
        shutil.copytree(entry, tmp, dirs_exist_ok=True)
        os.replace(tmp, target)  # atomic: concurrent workers never see half an entry
        copied += 1
    return copied


def default_triton_cache() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepinfer_sm80.aot", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the shipped kernels for Ampere into DEST")
    b.add_argument("dest", type=Path)
    b.add_argument("--arches", default="8.0 8.6", help='compute capabilities, e.g. "8.0 8.6"')
    s = sub.add_parser("seed", help="copy AOT entries from SRC into a Triton cache")
    s.add_argument("src", type=Path)
    s.add_argument("triton_cache", type=Path, nargs="?", default=None)
    args = parser.parse_args(argv)
    if args.cmd == "build":
        try:
            manifest = build(args.dest, parse_ampere_arches(args.arches))
        except (ValueError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(
            f"{args.dest}: {len(manifest['kernels'])} kernel builds for "
            f"{', '.join(manifest['arches'])}, {len(manifest['entries'])} cache entries"
        )
        return 0
    n = seed(args.src, args.triton_cache or default_triton_cache())
    print(f"seeded {n} Triton cache entries from {args.src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
