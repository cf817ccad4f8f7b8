"""deepinfer_sm80.aot: the image's ahead-of-time kernel cache (build and seed), and the
TileLang warmup that reads it back."""

import json
import re

import pytest

from deepinfer_sm80 import aot, tilelang_build, vllm_mhc_aot
from deepinfer_sm80.arch import parse_ampere_arches
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs
from deepinfer_sm80.triton_launch_compile import build_id


def test_parse_arches_accepts_ampere_only():
    assert parse_ampere_arches("8.0 8.6") == [80, 86]
    assert parse_ampere_arches("8.0,8.6") == [80, 86]
    for bad in ("9.0", "sm80", "", "8", "8.9", "8.7"):
        with pytest.raises(ValueError, match="--arches"):
            parse_ampere_arches(bad)
    with pytest.raises(ValueError, match=r"\(9\.0 with --hopper-proxy\)"):
        parse_ampere_arches("9.0")


def test_hopper_proxy_adds_sm_90_and_nothing_else():
    assert parse_ampere_arches("9.0", hopper_proxy=True) == [90]
    assert parse_ampere_arches("8.0 9.0", hopper_proxy=True) == [80, 90]
    for bad in ("10.0", "8.9", "9.1"):
        with pytest.raises(ValueError, match="--arches"):
            parse_ampere_arches(bad, hopper_proxy=True)


def test_tilelang_targets_are_what_its_detector_builds():
    """The AOT target of each capability is the one TileLang's detector builds on such a
    GPU (tilelang.contrib.nvcc.get_target_arch): Hopper's is arch-specific, sm_90a."""
    assert tilelang_build.cuda_target(80) == {"kind": "cuda", "arch": "sm_80"}
    assert tilelang_build.cuda_target(86) == {"kind": "cuda", "arch": "sm_86"}
    assert tilelang_build.cuda_target(90) == {"kind": "cuda", "arch": "sm_90a"}


def write_triton_manifest(folder, **build_changes):
    """An AOT folder's manifest recording this process's Triton build, changed as given."""
    folder.mkdir(parents=True, exist_ok=True)
    build = {**build_id(), **build_changes}
    (folder / aot.MANIFEST).write_text(json.dumps({"triton_build": build}))


def test_seed_copies_missing_entries_and_never_overwrites(tmp_path):
    src = tmp_path / "aot" / aot.TRITON_SUBDIR
    for name in ("aaa", "bbb"):
        (src / name).mkdir(parents=True)
        (src / name / "k.cubin").write_bytes(name.encode())
    write_triton_manifest(tmp_path / "aot")
    cache = tmp_path / "cache"
    (cache / "bbb").mkdir(parents=True)
    (cache / "bbb" / "k.cubin").write_bytes(b"compiled here")
    assert aot.seed(tmp_path / "aot", cache) == 1
    assert (cache / "aaa" / "k.cubin").read_bytes() == b"aaa"
    assert (cache / "bbb" / "k.cubin").read_bytes() == b"compiled here"
    assert not list(cache.glob(".*seeding"))
    assert aot.seed(tmp_path / "aot", cache) == 0
    assert aot.seed(tmp_path / "absent", cache) == 0


def test_seed_refuses_entries_of_another_triton_build(tmp_path, capsys):
    """Entries compiled by Triton for another Python (another compiled library, so
    another triton_key) or by a build that recorded none are never found by a launch
    here: seeding refuses them, naming both builds and the rebuild command, and copies
    nothing; the CLI says so and exits 2."""
    src = tmp_path / "aot"
    (src / aot.TRITON_SUBDIR / "entry").mkdir(parents=True)
    cache = tmp_path / "cache"
    write_triton_manifest(src, python="3.99", triton_key_sha256="0" * 64)
    with pytest.raises(aot.ForeignTritonBuildError, match=r"Python 3\.99 .*Rebuild the folder"):
        aot.seed(src, cache)
    manifest = json.loads((src / aot.MANIFEST).read_text())
    manifest.update(arches=["sm_80", "sm_86"])
    (src / aot.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(
        aot.ForeignTritonBuildError, match=re.escape(f'build {src} --arches "8.0 8.6"') + "$"
    ):
        aot.seed(src, cache)
    manifest.update(arches=["sm_90"], hopper_proxy=True)
    (src / aot.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(
        aot.ForeignTritonBuildError, match=re.escape('--arches "9.0" --hopper-proxy') + "$"
    ):
        aot.seed(src, cache)
    assert not cache.exists() or not any(cache.iterdir())
    (src / aot.MANIFEST).write_text(json.dumps({"arches": ["sm_80"]}))
    with pytest.raises(aot.ForeignTritonBuildError, match="recorded no triton_build"):
        aot.seed(src, cache)
    assert aot.main(["seed", str(src), str(cache)]) == 2
    assert "recorded no triton_build" in capsys.readouterr().err
    write_triton_manifest(src)
    assert aot.seed(src, cache) == 1


@pytest.mark.aot
def test_build_writes_cubins_and_a_manifest(tmp_path, monkeypatch):
    """One real spec, compiled for sm_80: the Triton cache gets the entry, the manifest
    lists it (the image runs the same code over every spec)."""
    spec = next(s for s in all_ampere_kernel_specs() if s.label.startswith("kv_cache.insert"))
    monkeypatch.setattr("deepinfer_sm80.ops.registry.all_ampere_kernel_specs", lambda: [spec])
    manifest = aot.build_triton(tmp_path, [80])
    assert manifest["arches"] == ["sm_80"]
    assert [k["label"] for k in manifest["kernels"]] == [spec.label]
    assert manifest["entries"], "no Triton cache entry written"
    assert manifest["triton_build"] == build_id()
    cubins = list((tmp_path / aot.TRITON_SUBDIR).rglob("*.cubin"))
    assert cubins, "the cache holds no cubin"
    assert json.loads((tmp_path / aot.MANIFEST).read_text()) == manifest


def test_build_refuses_bad_arguments_before_compiling_anything(tmp_path, capsys):
    assert aot.main(["build", str(tmp_path / "a"), "--arches", "9.0"]) == 2
    assert "--arches: '9.0' is not an Ampere compute capability" in capsys.readouterr().err
    assert aot.main(["build", str(tmp_path / "b"), "--max-num-batched-tokens", "0"]) == 2
    assert "--max-num-batched-tokens: expected >= 1, got 0" in capsys.readouterr().err
    assert aot.main(["build", str(tmp_path / "c"), "--jobs", "0"]) == 2
    assert "--jobs: expected >= 1, got 0" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in "abc")


@pytest.fixture
def one_kernel_per_part(monkeypatch):
    """``aot build`` cut to one kernel per part: a Triton spec, an mHC variant, a sparse
    MLA variant and a key of vLLM's mHC pre-norm kernel; returns the first three.
    TileLang's memory caches are emptied: kernels this process already compiled would be
    served from them and never reach the new folders (the image build is a fresh process)."""
    from tilelang.cache import _dispatch_map

    from deepinfer_sm80.ops.mhc.ops import post_variant
    from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig
    from deepinfer_sm80.ops.sparse_mla import tilelang_kernels

    spec = next(s for s in all_ampere_kernel_specs() if s.label.startswith("kv_cache.insert"))
    mhc_variant = post_variant(MhcModelConfig().hidden_size, MhcModelConfig().hc_mult)
    mla_variant = tilelang_kernels.prefill_variant(128, True, True)
    monkeypatch.setattr("deepinfer_sm80.ops.registry.all_ampere_kernel_specs", lambda: [spec])
    monkeypatch.setattr(
        "deepinfer_sm80.ops.mhc.warmup.shipped_variants", lambda *a, **k: [mhc_variant]
    )
    monkeypatch.setattr(tilelang_kernels, "shipped_variants", lambda: [mla_variant])
    # The first of the build's own variants: an sm_90 build's elaborates PDL, as it must.
    shipped = vllm_mhc_aot.shipped_variants
    monkeypatch.setattr(vllm_mhc_aot, "shipped_variants", lambda *a: shipped(*a)[:1])
    for cache in _dispatch_map.values():
        monkeypatch.setattr(cache, "_memory_cache", {})
    tilelang_build.forget_compiled()
    return spec, mhc_variant, mla_variant


@pytest.mark.aot
def test_one_command_builds_every_part_where_the_runtime_reads_it(
    tmp_path, one_kernel_per_part, capsys
):
    """``python -m deepinfer_sm80.aot build`` (the image's one AOT step), cut to one kernel
    per part and sm_80: the Triton spec into DEST/triton with DEST/manifest.json, the mHC
    and sparse MLA TileLang variants into DEST/mhc and DEST/sparse_mla, each a TileLang
    cache folder with its manifest, at the folders the plugin's warmup seeds from."""
    from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig

    spec, mhc_variant, mla_variant = one_kernel_per_part

    dest = tmp_path / "kernels"
    assert aot.main(["build", str(dest), "--arches", "8.0", "--max-num-batched-tokens", "64"]) == 0
    out = capsys.readouterr().out
    for part in ("triton", "mhc", "sparse_mla", "vllm_mhc"):
        assert f"{dest}: {part}: 1 kernel builds for sm_80" in out

    triton = json.loads((dest / aot.MANIFEST).read_text())
    assert triton["arches"] == ["sm_80"] and triton["entries"]
    assert [k["label"] for k in triton["kernels"]] == [spec.label]
    assert list((dest / aot.TRITON_SUBDIR).rglob("*.cubin"))

    for sub, variant in ((aot.MHC_SUBDIR, mhc_variant), (aot.SPARSE_MLA_SUBDIR, mla_variant)):
        folder = aot.tilelang_aot_dir(dest, sub)
        assert folder == dest / sub
        manifest = json.loads((folder / tilelang_build.MANIFEST).read_text())
        assert manifest["arches"] == ["sm_80"]
        assert [(k["label"], k["arch"], k["error"]) for k in manifest["kernels"]] == [
            (variant.label, "sm_80", None)
        ]
        assert any(p.is_file() for p in (folder / tilelang_build.TILELANG_SUBDIR).rglob("*"))
        live = tmp_path / f"live_{sub}"
        assert tilelang_build.seed_tilelang_cache(folder, live) > 0
    vllm_mhc = aot.tilelang_aot_dir(dest, aot.VLLM_MHC_SUBDIR)
    manifest = json.loads((vllm_mhc / tilelang_build.MANIFEST).read_text())
    assert manifest["vllm"] == "0.33.0" and manifest["arches"] == ["sm_80"]
    assert [k["label"] for k in manifest["kernels"]] == [
        v.label for v in vllm_mhc_aot.shipped_variants(MhcModelConfig(), 64)
    ]
    assert tilelang_build.seed_tilelang_cache(vllm_mhc, tmp_path / "live_vllm_mhc") > 0
    mhc = json.loads((dest / aot.MHC_SUBDIR / tilelang_build.MANIFEST).read_text())
    assert mhc["max_num_batched_tokens"] == 64
    assert mhc["model"]["hidden_size"] == MhcModelConfig().hidden_size
    assert aot.tilelang_aot_dir(None, aot.MHC_SUBDIR) is None


@pytest.mark.aot
def test_parts_built_in_parallel_are_the_ones_built_in_turn(
    tmp_path, one_kernel_per_part, monkeypatch, capsys
):
    """``--jobs 4``: the four parts in forked processes give the same folders and manifests
    (compile times aside) as one after the other; a part that fails still fails the build,
    once the others have ended."""

    def manifests(dest):
        found = {}
        for path in sorted(dest.rglob(aot.MANIFEST)):
            manifest = json.loads(path.read_text())
            for row in manifest.get("kernels", []):
                row.pop("compile_seconds", None)
            found[str(path.relative_to(dest))] = manifest
        return found

    assert aot.main(["build", str(tmp_path / "turn"), "--arches", "8.0"]) == 0
    assert aot.main(["build", str(tmp_path / "jobs"), "--arches", "8.0", "--jobs", "4"]) == 0
    out = capsys.readouterr().out
    for part in aot.PARTS:
        assert f"{tmp_path / 'jobs'}: {part}: 1 kernel builds for sm_80" in out
    in_turn, in_parallel = manifests(tmp_path / "turn"), manifests(tmp_path / "jobs")
    assert len(in_parallel) == len(aot.PARTS) and in_parallel == in_turn

    def no_fit(*args, **kwargs):
        raise RuntimeError("sparse MLA AOT kernels do not fit Ampere: (stand-in)")

    monkeypatch.setattr(aot, "build_sparse_mla", no_fit)
    dest = tmp_path / "failing"
    assert aot.main(["build", str(dest), "--arches", "8.0", "--jobs", "4"]) == 2
    assert "(stand-in)" in capsys.readouterr().err
    assert (dest / aot.VLLM_MHC_SUBDIR / tilelang_build.MANIFEST).is_file()


def test_warm_seeds_only_from_an_aot_folder_that_exists(tmp_path, monkeypatch):
    seeded = []
    monkeypatch.setattr(tilelang_build, "seed_tilelang_cache", lambda d: seeded.append(d) or 3)
    logs = []
    assert tilelang_build.warm([], "op", tmp_path / "absent", log=logs.append) == []
    assert seeded == [] and not any("seeded" in line for line in logs)
    assert tilelang_build.warm([], "op", tmp_path, log=logs.append) == []
    assert seeded == [tmp_path]
    assert f"op: seeded 3 TileLang cache files from {tmp_path}" in logs


@pytest.mark.aot
def test_hopper_proxy_build_is_what_a_hopper_server_loads(
    tmp_path, monkeypatch, one_kernel_per_part, capsys
):
    """``build --arches 9.0 --hopper-proxy``, cut to one kernel per part: manifests marked
    ``hopper_proxy``, and with TileLang's own detector on a capability-9.0 device (torch's
    answers stubbed) the mHC variant loads from the folder; compiling is made to fail, so
    a cache miss would raise."""
    import tilelang.cuda.target as tl_target
    import torch
    from tilelang.cache import _dispatch_map
    from tilelang.jit.kernel import JITKernel

    _, mhc_variant, _ = one_kernel_per_part

    dest = tmp_path / "kernels"
    argv = ["build", str(dest), "--arches", "9.0", "--max-num-batched-tokens", "64"]
    assert aot.main(argv) == 2  # not without the flag
    assert not dest.exists()
    assert aot.main([*argv, "--hopper-proxy"]) == 0
    out = capsys.readouterr().out
    for part in ("triton", "mhc", "sparse_mla", "vllm_mhc"):
        assert f"{dest}: {part}: 1 kernel builds for sm_90" in out
    for manifest_path in (dest / aot.MANIFEST, dest / aot.MHC_SUBDIR / tilelang_build.MANIFEST,
                          dest / aot.SPARSE_MLA_SUBDIR / tilelang_build.MANIFEST,
                          dest / aot.VLLM_MHC_SUBDIR / tilelang_build.MANIFEST):  # fmt: skip
        manifest = json.loads(manifest_path.read_text())
        assert manifest["hopper_proxy"] is True and manifest["arches"] == ["sm_90"]

    live = tmp_path / "live"
    assert tilelang_build.seed_tilelang_cache(dest / aot.MHC_SUBDIR, live) > 0
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(live))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(tl_target, "check_cuda_availability", lambda: True)
    assert tl_target._detect_torch_cuda_arch() == "sm_90a"

    def no_compile(self, *args, **kwargs):
        raise AssertionError("the variant was compiled instead of loaded from the AOT folder")

    monkeypatch.setattr(JITKernel, "_compile_and_create_adapter", no_compile)
    for cache in _dispatch_map.values():
        monkeypatch.setattr(cache, "_memory_cache", {})
    tilelang_build.forget_compiled()
    try:
        assert tilelang_build.get_kernel(mhc_variant) is not None
    finally:
        tilelang_build.forget_compiled()


def test_an_ampere_build_is_not_marked_as_a_proxy():
    assert aot._proxy_field([80, 86]) == {}
    assert aot._proxy_field([90]) == {"hopper_proxy": True}
