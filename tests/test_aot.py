"""deepinfer_sm80.aot: the image's ahead-of-time kernel cache (build and seed)."""

import json

import pytest

from deepinfer_sm80 import aot
from deepinfer_sm80.arch import parse_ampere_arches
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs


def test_parse_arches_accepts_ampere_only():
    assert parse_ampere_arches("8.0 8.6") == [80, 86]
    assert parse_ampere_arches("8.0,8.6") == [80, 86]
    for bad in ("9.0", "sm80", "", "8"):
        with pytest.raises(ValueError, match="--arches"):
            parse_ampere_arches(bad)


def test_seed_copies_missing_entries_and_never_overwrites(tmp_path):
    src = tmp_path / "aot" / aot.TRITON_SUBDIR
    for name in ("aaa", "bbb"):
        (src / name).mkdir(parents=True)
        (src / name / "k.cubin").write_bytes(name.encode())
    cache = tmp_path / "cache"
    (cache / "bbb").mkdir(parents=True)
    (cache / "bbb" / "k.cubin").write_bytes(b"compiled here")
    assert aot.seed(tmp_path / "aot", cache) == 1
    assert (cache / "aaa" / "k.cubin").read_bytes() == b"aaa"
    assert (cache / "bbb" / "k.cubin").read_bytes() == b"compiled here"
    assert not list(cache.glob(".*seeding"))
    assert aot.seed(tmp_path / "aot", cache) == 0
    assert aot.seed(tmp_path / "absent", cache) == 0


@pytest.mark.aot
def test_build_writes_cubins_and_a_manifest(tmp_path, monkeypatch):
    """One real spec, compiled for sm_80: the Triton cache gets the entry, the manifest
    lists it (the image runs the same code over every spec)."""
    spec = next(s for s in all_ampere_kernel_specs() if s.label.startswith("kv_cache.insert"))
    monkeypatch.setattr("deepinfer_sm80.ops.registry.all_ampere_kernel_specs", lambda: [spec])
    manifest = aot.build(tmp_path, [80])
    assert manifest["arches"] == ["sm_80"]
    assert [k["label"] for k in manifest["kernels"]] == [spec.label]
    assert manifest["entries"], "no Triton cache entry written"
    cubins = list((tmp_path / aot.TRITON_SUBDIR).rglob("*.cubin"))
    assert cubins, "the cache holds no cubin"
    assert json.loads((tmp_path / aot.MANIFEST).read_text()) == manifest
