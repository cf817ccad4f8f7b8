"""Read a small YAML file someone wrote by hand, with bounds that make hostile input fail
fast with one message: a regular file only (a FIFO or a device would block or never
end), a size cap checked before reading, strict UTF-8, no aliases (a few hundred bytes
of nested aliases expand to gigabytes), a nesting limit, and duplicate keys refused
(YAML would otherwise keep the last one silently).

Errors are ``ValueError`` whose message names the file and the place; callers wrap it in
their own error type.
"""

from __future__ import annotations

import stat
from pathlib import Path

import yaml

MAX_BYTES = 256 * 1024  # the largest shipped config is a few KiB
MAX_DEPTH = 16  # topology files nest three levels


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream, path: Path):
        super().__init__(stream)
        self._path = path
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ValueError(
                f"{self._path}: line {mark.line + 1}: YAML aliases (*name) are not accepted "
                "here; write the value out"
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ValueError(
                    f"{self._path}: line {mark.line + 1}: nested deeper than {MAX_DEPTH} "
                    "levels; no field of this file nests that deep"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise ValueError(
                    f"{self._path}: line {key_node.start_mark.line + 1}: a mapping key must "
                    "be a plain name"
                ) from None
            if key in seen:
                raise ValueError(
                    f"{self._path}: line {key_node.start_mark.line + 1}: key {key!r} appears "
                    f"twice (first at line {seen[key]}); keep one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """The file's text, or ValueError naming why it cannot be used."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the file ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ValueError(f"{path}: {kind}; give a YAML file")
    if st.st_size > max_bytes:
        raise ValueError(
            f"{path}: {st.st_size:,} bytes, more than the {max_bytes:,} a config file may have"
        )
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the file ({exc.strerror})") from None
    if len(data) > max_bytes:  # grew while we looked
        raise ValueError(f"{path}: more than the {max_bytes:,} bytes a config file may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); save it "
            "as UTF-8"
        ) from None


def load(path: Path, max_bytes: int = MAX_BYTES):
    """Parse ``path`` with the bounds above; ValueError on any problem."""
    text = read_text(path, max_bytes)
    loader = _BoundedLoader(text, path)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ValueError(f"{path}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to read") from None
    finally:
        loader.dispose()
