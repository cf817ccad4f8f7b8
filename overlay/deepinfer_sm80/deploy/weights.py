"""``deepinfer weights download|verify``: fetch the checkpoint and prove it is whole.

``verify`` reads ``model.safetensors.index.json`` and checks, for every shard it maps:
the file exists; its safetensors header parses; the file is exactly as long as the
header says (catches truncated downloads); every tensor the index puts in it is in its
header. With ``check_hashes``, shards inside a Hugging Face cache (snapshot files that
link to ``blobs/<sha256>``) are hashed and compared with that name: the hub names
large-file blobs by their SHA-256.

``download`` is ``huggingface_hub.snapshot_download`` (resumes partial files) into the
cache the server reads; it needs network access and is not exercised by the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from pathlib import Path

INDEX_FILE = "model.safetensors.index.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _header(path: Path) -> tuple[dict, int]:
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 * 2**20:
            raise ValueError(f"header length {n} is not plausible")
        text = f.read(n)
    try:
        header = json.loads(text)
    except ValueError:
        raise ValueError("the safetensors header is not valid JSON") from None
    return header, 8 + n


def verify(folder: str | os.PathLike, check_hashes: bool = False) -> list[str]:
    """Every problem found (empty when the checkpoint is whole)."""
    root = Path(folder)
    index_path = root / INDEX_FILE
    if not index_path.exists():
        return [f"{index_path}: missing; is {root} a safetensors checkpoint folder?"]
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError):
        return [f"{index_path}: not a safetensors index (no weight_map)"]
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(tensor)
    problems = []
    for shard, tensors in sorted(by_shard.items()):
        path = root / shard
        if not path.exists():
            problems.append(
                f"{path}: missing ({len(tensors)} tensors); run `deepinfer weights "
                "download` again to resume"
            )
            continue
        try:
            header, data_start = _header(path)
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: unreadable ({exc}); delete it and download again")
            continue
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        expected = data_start + max(ends, default=0)
        actual = path.stat().st_size
        if actual != expected:
            problems.append(
                f"{path}: {actual} bytes, the header describes {expected}: "
                "truncated or corrupt; delete it and download again"
            )
        absent = [t for t in tensors if t not in header]
        if absent:
            problems.append(
                f"{path}: {len(absent)} tensors the index maps here are absent (first: {absent[0]})"
            )
        if check_hashes and path.is_symlink():
            blob = Path(os.path.realpath(path)).name
            if _SHA256.match(blob):
                digest = hashlib.sha256()
                with path.open("rb") as f:
                    for chunk in iter(lambda: f.read(1 << 24), b""):
                        digest.update(chunk)
                if digest.hexdigest() != blob:
                    problems.append(
                        f"{path}: SHA-256 {digest.hexdigest()} differs from the "
                        f"hub's {blob}; delete the blob and download again"
                    )
    return problems


def download(repo: str, cache_dir: str | None = None, revision: str | None = None) -> str:
    """Download (or resume) the checkpoint into the Hugging Face cache; returns its path."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise RuntimeError(
            "downloading needs huggingface_hub (pip install huggingface_hub)"
        ) from None
    return snapshot_download(repo_id=repo, cache_dir=cache_dir, revision=revision)
