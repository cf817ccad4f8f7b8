"""deepinfer weights verify on small checkpoints built for the test."""

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from deepinfer_sm80.deploy import cli, weights


def _shard(path: Path, tensors: dict[str, int]) -> None:
    """A real safetensors file: F32 tensors of the given element counts."""
    header, offset = {}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + os.urandom(offset))


def make_checkpoint(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    _shard(root / "model-00001-of-00002.safetensors", {"a.weight": 16, "b.weight": 3})
    _shard(root / "model-00002-of-00002.safetensors", {"c.weight": 5})
    index = {"metadata": {"total_size": 96}, "weight_map": {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00001-of-00002.safetensors",
        "c.weight": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (root / weights.INDEX_FILE).write_text(json.dumps(index))
    return root


def test_whole_checkpoint_verifies(tmp_path):
    assert weights.verify(make_checkpoint(tmp_path / "ckpt")) == []


def test_missing_truncated_and_incomplete_shards(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    shard1 = root / "model-00001-of-00002.safetensors"
    shard1.write_bytes(shard1.read_bytes()[:-4])
    (root / "model-00002-of-00002.safetensors").unlink()
    index = json.loads((root / weights.INDEX_FILE).read_text())
    index["weight_map"]["d.weight"] = "model-00001-of-00002.safetensors"
    (root / weights.INDEX_FILE).write_text(json.dumps(index))
    problems = weights.verify(root)
    assert any("truncated or corrupt" in p for p in problems)
    assert any("00002-of-00002.safetensors: missing" in p for p in problems)
    assert any("absent (first: d.weight)" in p for p in problems)


def test_unreadable_header_and_missing_index(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    (root / "model-00002-of-00002.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope")
    assert any("not valid JSON" in p for p in weights.verify(root))
    assert "missing; is" in weights.verify(tmp_path)[0]


def test_hub_cache_blobs_are_hashed(tmp_path):
    """In the HF cache a snapshot file links to blobs/<sha256>: --hash compares them."""
    src = make_checkpoint(tmp_path / "src")
    snap = tmp_path / "cache" / "snapshots" / "rev"
    blobs = tmp_path / "cache" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir(parents=True)
    for f in src.iterdir():
        data = f.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    assert weights.verify(snap, check_hashes=True) == []
    blob = Path(os.path.realpath(snap / "model-00002-of-00002.safetensors"))
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # same length, one flipped byte: only the hash can tell
    blob.write_bytes(bytes(data))
    assert weights.verify(snap) == []
    assert any("SHA-256" in p for p in weights.verify(snap, check_hashes=True))


def test_cli(tmp_path, capsys):
    root = make_checkpoint(tmp_path / "ckpt")
    assert cli.main(["weights", "verify", str(root)]) == 0
    (root / "model-00002-of-00002.safetensors").unlink()
    assert cli.main(["weights", "verify", str(root)]) == 1
    assert "missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["weights", "verify"])
