"""Which of our Triton kernels a server compiled although an AOT folder was seeded, and
how each launch differs from the nearest shipped spec.

A server's Triton cache holds the seeded AOT entries and what its launches compiled.
Each compiled entry keeps the kernel's Triton IR, whose signature shows what the launch
specialized: the arguments it passed (an integer equal to 1 becomes a constexpr and
drops out), their types and which were divisible by 16; the entry's metadata gives
``num_warps`` and ``num_stages``. Against the registry's specs of that kernel
(``ops.registry``) the nearest one is named with every difference, which is the change
that spec needs for the AOT build to cover that launch. Constexpr values are folded into
the IR and cannot be compared; two specs that differ only in them look alike here.

    python -m deepinfer_sm80.triton_cache_audit TRITON_CACHE [--aot DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from deepinfer_sm80.kernel_spec import KernelSpec

# The kernel's header: one line of the IR, ``tt.func public @NAME(ARGS) attributes {...} {``.
_FUNC = re.compile(
    r"^\s*tt\.func public @(\w+)\((.*)\)(?:\s+attributes\s+\{[^}]*\})?\s*\{\s*$", re.M
)
_ARG = re.compile(r"%(\w+): ([^\s{]+)(\s*\{[^}]*\})?")
# Triton IR has no unsigned types: a *u8 spec argument is !tt.ptr<i8> there.
_IR_TYPES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "i1": "i1", "i8": "i8",
             "i16": "i16", "i32": "i32", "i64": "i64", "f8E4M3FN": "fp8e4nv"}  # fmt: skip
_UNSIGNED = {"u1": "i1", "u8": "i8", "u16": "i16", "u32": "i32", "u64": "i64"}


@dataclass(frozen=True)
class CompiledLaunch:
    """One compiled entry: the kernel and what its launch specialized."""

    entry: str
    kernel: str
    args: dict[str, str]  # non-constexpr argument -> type, as Triton IR names it
    divisible: frozenset[str]
    num_warps: int
    num_stages: int


def _ir_type(text: str) -> str:
    ptr = re.fullmatch(r"!tt\.ptr<(\w+)>", text)
    if ptr:
        return "*" + _IR_TYPES.get(ptr.group(1), ptr.group(1))
    return _IR_TYPES.get(text, text)


def _spec_type(kind: str) -> str:
    """A spec's Triton type as it shows in the IR."""
    star = "*" if kind.startswith("*") else ""
    base = kind.lstrip("*")
    return star + _UNSIGNED.get(base, base)


def entry_kernel(entry: Path) -> str | None:
    """The kernel a Triton cache entry holds (named by its ``__grp__NAME.json``); None for
    a launcher or utility module."""
    groups = list(entry.glob("__grp__*.json"))
    return groups[0].name[len("__grp__") : -len(".json")] if groups else None


def read_entry(entry: Path) -> CompiledLaunch | None:
    """The launch an entry was compiled for; None for an entry without a kernel's IR (a
    launcher or utility module)."""
    name = entry_kernel(entry)
    if name is None:
        return None
    ttir, meta = entry / f"{name}.ttir", entry / f"{name}.json"
    if not ttir.is_file() or not meta.is_file():
        return None
    func = _FUNC.search(ttir.read_text())
    if func is None:
        return None
    args, divisible = {}, set()
    for arg in _ARG.finditer(func.group(2)):
        args[arg.group(1)] = _ir_type(arg.group(2))
        if arg.group(3) and "tt.divisibility = 16" in arg.group(3):
            divisible.add(arg.group(1))
    metadata = json.loads(meta.read_text())
    return CompiledLaunch(entry.name, func.group(1), args, frozenset(divisible),
                          int(metadata["num_warps"]), int(metadata["num_stages"]))  # fmt: skip


def differences(spec: KernelSpec, launch: CompiledLaunch) -> list[str]:
    """What ``spec`` would have to say to match ``launch`` (empty: they look alike)."""
    out = []
    for name, kind in spec.signature.items():
        if name not in launch.args:
            out.append(f"{name}: a constexpr in the launch (it passed 1), an argument in the spec")
        elif _spec_type(kind) != launch.args[name]:
            out.append(f"{name}: type {launch.args[name]} in the launch, {kind} in the spec")
    for name in launch.args:
        if name not in spec.signature:
            out.append(f"{name}: an argument in the launch, a constexpr in the spec")
    divisible = spec.divisible_args()
    for name in sorted((launch.divisible - divisible) & set(spec.signature)):
        out.append(f"{name}: divisible by 16 in the launch, not in the spec")
    for name in sorted((divisible - launch.divisible) & set(launch.args)):
        out.append(f"{name}: not divisible by 16 in the launch, divisible in the spec")
    if (spec.num_warps, spec.num_stages) != (launch.num_warps, launch.num_stages):
        out.append(f"num_warps/num_stages {launch.num_warps}/{launch.num_stages} in the launch, "
                   f"{spec.num_warps}/{spec.num_stages} in the spec")  # fmt: skip
    return out


def audit(cache: Path, specs: list[KernelSpec], seeded: set[str] = frozenset()) -> list[dict]:
    """Every entry of ``cache`` outside ``seeded`` that compiled one of the specs' kernels:
    the kernel, the nearest spec and its differences (none: a launch the AOT build covers,
    compiled here because the folder lacked it or was not seeded)."""
    by_kernel: dict[str, list[KernelSpec]] = {}
    for spec in specs:
        by_kernel.setdefault(spec.kernel.rpartition(":")[2].rpartition(".")[2], []).append(spec)
    found = []
    for entry in sorted(cache.iterdir()) if cache.is_dir() else []:
        if entry.name in seeded or not entry.is_dir():
            continue
        launch = read_entry(entry)
        if launch is None or launch.kernel not in by_kernel:
            continue
        nearest = min(by_kernel[launch.kernel], key=lambda s: len(differences(s, launch)))
        found.append({
            "entry": launch.entry,
            "kernel": launch.kernel,
            "nearest_spec": nearest.label,
            "differences": differences(nearest, launch),
        })  # fmt: skip
    return found


def seeded_entries(aot_dir: Path | None) -> set[str]:
    """The Triton entries an AOT folder brings (its manifest's ``entries``)."""
    if aot_dir is None:
        return set()
    try:
        return set(json.loads((aot_dir / "manifest.json").read_text())["entries"])
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{aot_dir}: no readable manifest.json with entries ({exc})") from exc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deepinfer_sm80.triton_cache_audit",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("cache", type=Path, help="a server's Triton cache (TRITON_CACHE_DIR)")
    p.add_argument("--aot", type=Path, help="the AOT folder seeded into it (DEEPINFER_AOT_DIR)")
    args = p.parse_args(argv)
    from deepinfer_sm80.ops.registry import all_ampere_kernel_specs

    try:
        found = audit(args.cache, all_ampere_kernel_specs(), seeded_entries(args.aot))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for f in found:
        why = "; ".join(f["differences"]) or "matches it: the AOT folder lacked this entry"
        print(f"{f['kernel']} ({f['entry'][:12]}): nearest spec {f['nearest_spec']}: {why}")
    print(f"{len(found)} compiles of our kernels outside the AOT folder")
    return 0


if __name__ == "__main__":
    sys.exit(main())
