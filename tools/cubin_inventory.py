"""Which GPUs a shared library's device code runs on, and which library defines a custom op.

A CUDA library carries one fat binary per compilation unit: cubins (SASS) for some
``sm_XY`` and, optionally, PTX for some ``compute_XY``. A cubin built for ``sm_XY`` runs on
``sm_XZ`` with ``Z >= Y`` (same major; ``sm_90a``-style arch-specific cubins run only on
their own arch); PTX for ``compute_XY`` is JIT-compiled by the driver for any later GPU.
So sm_80 needs an ``sm_80`` cubin (or PTX <= 80) and sm_86 an ``sm_80``/``sm_86`` cubin (or
PTX <= 86).

``cuobjdump --list-elf/--list-ptx`` gives the archs of a library and ``-res-usage`` the
kernel functions inside each cubin. The op of a kernel is not recorded anywhere; we match
an op to the kernels whose mangled names contain the op's name (letters and digits only,
case-insensitive), which finds most hand-written CUDA ops (``persistent_topk`` ->
``persistent_topk_kernel``) and misses templated ones (``marlin_gemm`` -> ``Marlin<...>``);
a missed op is checked at library level only, and reported so.

Listings are cached per library file, keyed by path, size and mtime, because
``cuobjdump`` takes seconds on the largest vLLM libraries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Where a cuobjdump may be, in the order we try them.
_CUOBJDUMP_ENV = "CUOBJDUMP"


def find_cuobjdump() -> Path:
    """``$CUOBJDUMP``, the nvidia-cuda-nvcc wheel, the CUDA toolkit, PATH, or Triton's copy."""
    candidates: list[Path] = []
    if os.environ.get(_CUOBJDUMP_ENV):
        candidates.append(Path(os.environ[_CUOBJDUMP_ENV]))
    try:
        import nvidia.cuda_nvcc  # type: ignore[import-not-found]

        for root in nvidia.cuda_nvcc.__path__:
            candidates.append(Path(root) / "bin" / "cuobjdump")
    except ImportError:
        pass
    candidates.append(Path("/usr/local/cuda/bin/cuobjdump"))
    on_path = shutil.which("cuobjdump")
    if on_path:
        candidates.append(Path(on_path))
    try:
        import triton

        candidates.append(Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump")
    except ImportError:
        pass
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(
        "no cuobjdump found: set CUOBJDUMP, install nvidia-cuda-nvcc, or install triton "
        f"(looked in {[str(c) for c in candidates]})"
    )


_ARCH_LINE = re.compile(r"arch = (sm_\d+[a-z]?)")
_FUNCTION_LINE = re.compile(r"^\s*Function ([^:\s]+):")
_LISTED = re.compile(r"\.(sm_\d+[a-z]?)\.(?:cubin|ptx)")


@dataclass
class LibraryCode:
    """The device code one shared library carries."""

    path: str
    size: int
    mtime_ns: int
    tool: str
    elf: dict[str, int] = field(default_factory=dict)  # arch -> cubins
    ptx: dict[str, int] = field(default_factory=dict)  # arch -> PTX files
    functions: dict[str, list[str]] = field(default_factory=dict)  # arch -> kernels

    def runs_on(self, cc: int) -> bool:
        """Whether some device code of this library can run on compute capability ``cc``."""
        return bool(self.runnable_archs(cc))

    def runnable_archs(self, cc: int) -> list[str]:
        out = [a for a in self.elf if cubin_runs_on(a, cc)]
        out += [f"ptx:{a}" for a in self.ptx if ptx_runs_on(a, cc)]
        return sorted(out)

    def kernels_for(self, op: str) -> dict[str, list[str]]:
        """Per arch, the kernels whose mangled name contains the op's name."""
        key = _normalize(op)
        return {
            arch: [f for f in names if key in _normalize(f)]
            for arch, names in self.functions.items()
            if any(key in _normalize(f) for f in names)
        }


def _normalize(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


def _arch_number(arch: str) -> tuple[int, bool]:
    digits = re.match(r"sm_(\d+)([a-z]?)", arch)
    assert digits is not None, arch
    return int(digits.group(1)), bool(digits.group(2))


def cubin_runs_on(arch: str, cc: int) -> bool:
    number, specific = _arch_number(arch)
    if specific:
        return number == cc
    return number // 10 == cc // 10 and number <= cc


def ptx_runs_on(arch: str, cc: int) -> bool:
    number, specific = _arch_number(arch)
    return not specific and number <= cc


def _run(tool: Path, *args: str) -> str:
    run = subprocess.run(
        [str(tool), *args], capture_output=True, text=True, check=False, timeout=600
    )
    # "no PTX/ELF found" is a normal answer, reported on stderr with status 255
    return run.stdout + run.stderr


def list_library(path: Path, tool: Path | None = None) -> LibraryCode:
    """Run cuobjdump on one library (no cache)."""
    tool = tool or find_cuobjdump()
    stat = path.stat()
    code = LibraryCode(str(path), stat.st_size, stat.st_mtime_ns, str(tool))
    for line in _run(tool, "--list-elf", str(path)).splitlines():
        m = _LISTED.search(line)
        if m:
            code.elf[m.group(1)] = code.elf.get(m.group(1), 0) + 1
    for line in _run(tool, "--list-ptx", str(path)).splitlines():
        m = _LISTED.search(line)
        if m:
            code.ptx[m.group(1)] = code.ptx.get(m.group(1), 0) + 1
    arch = None
    functions: dict[str, set[str]] = {}
    for line in _run(tool, "-res-usage", str(path)).splitlines():
        m = _ARCH_LINE.search(line)
        if m:
            arch = m.group(1)
            continue
        m = _FUNCTION_LINE.match(line)
        if m and arch is not None:
            functions.setdefault(arch, set()).add(m.group(1))
    code.functions = {a: sorted(f) for a, f in sorted(functions.items())}
    return code


def library_code(path: Path, cache_dir: Path | None = None) -> LibraryCode:
    """``list_library`` with a per-file cache keyed by path, size and mtime."""
    path = Path(path).resolve()
    if cache_dir is None:
        return list_library(path)
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    cached = Path(cache_dir) / f"{path.name}.{key}.json"
    if cached.is_file():
        return LibraryCode(**json.loads(cached.read_text()))
    code = list_library(path)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(code)))
    tmp.replace(cached)
    return code


def candidate_libraries(roots: list[Path]) -> list[Path]:
    """Every shared library under the given package directories."""
    out: list[Path] = []
    for root in roots:
        out += sorted(p for p in Path(root).rglob("*.so") if p.is_file())
    return out


def find_op_libraries(
    ops: list[tuple[str, str]], libraries: list[Path]
) -> dict[tuple[str, str], list[Path]]:
    """The libraries whose op schemas (``"name("`` after a NUL, as ``m.def`` stores them)
    or plain registrations (``"name"`` between NULs) define each ``(namespace, op)``;
    a library named after the namespace is preferred when several match."""
    blobs = {lib: lib.read_bytes() for lib in libraries}
    found: dict[tuple[str, str], list[Path]] = {}
    for namespace, op in ops:
        schema = b"\x00" + op.encode() + b"("
        plain = b"\x00" + op.encode() + b"\x00"
        hits = [lib for lib, blob in blobs.items() if schema in blob]
        hits = hits or [lib for lib, blob in blobs.items() if plain in blob]
        named = [lib for lib in hits if lib.name.startswith(namespace.lstrip("_") + "_")]
        named += [lib for lib in hits if lib.name.startswith(namespace + ".") and lib not in named]
        found[(namespace, op)] = named or hits
    return found
