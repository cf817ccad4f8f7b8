"""Snapshot this repository's own Python source into the code prompt corpus.

    python -m benchmarks.serving.build_code_corpus [--commit HEAD] [--out PATH]

The corpus is a frozen copy (not read live from the working tree) so that results taken at
different commits prompt the server with the same bytes. Rule, applied to one commit:
every ``*.py`` file tracked under ``overlay/``, ``benchmarks/`` and ``tests/`` except this
benchmark (``benchmarks/serving/``) and empty files, in ``git ls-tree`` path order, each
preceded by a ``# ==== file: <path> ====`` line. Only read-only git commands are used.
Rebuilding also rewrites the checksums in ``prompts/manifest.json``; a rebuilt corpus makes
new results incomparable with older ones (their ``prompt_material_sha256`` differs).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.serving.prompts import CODE_CORPUS, FILE_MARKER, write_manifest

ROOTS = ("overlay", "benchmarks", "tests")
EXCLUDE_PREFIX = "benchmarks/serving/"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def build(repo: Path, commit: str) -> str:
    full = _git(repo, "rev-parse", commit).strip()
    paths = [
        p
        for p in _git(repo, "ls-tree", "-r", "--name-only", full, "--", *ROOTS).splitlines()
        if p.endswith(".py") and not p.startswith(EXCLUDE_PREFIX)
    ]
    parts = [
        "# Code prompt corpus for benchmarks/serving: this repository's Python source at commit\n"
        f"# {full}, built by benchmarks/serving/build_code_corpus.py (rule in its docstring).\n"
    ]
    for path in paths:
        text = _git(repo, "show", f"{full}:{path}")
        if not text.strip():
            continue
        parts.append(f"{FILE_MARKER}{path} ====\n{text.rstrip()}\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--out", type=Path, default=CODE_CORPUS)
    args = ap.parse_args(argv)
    text = build(args.repo, args.commit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    write_manifest()
    print(f"wrote {args.out} ({len(text):,} characters) and the prompt manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
