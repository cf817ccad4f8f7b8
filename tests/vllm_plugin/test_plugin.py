"""The vLLM plugin against the real vLLM 0.33.0 (CPU): discovery, gates, the ledger's
targets and signatures, idempotence, refusals that patch nothing.

Runs with CUDA_VISIBLE_DEVICES= (set, empty; see tests/conftest.py). What cannot run
here: activation decided by a real SM8x GPU (NVML finds none on CPU, so these tests
force activation or pass the capability in), and the patched functions serving a model.
"""

import dataclasses
import importlib
import inspect
import json
import os
import subprocess
import sys

import pytest

from deepinfer_sm80.vllm_plugin import apply, ledger
from tools.tiers import import_or_skip

pytestmark = pytest.mark.vllm
vllm = import_or_skip("vllm")


def _target(path):
    module_name, _, attr = path.partition(":")
    return importlib.import_module(module_name), attr


@pytest.fixture
def restore_vllm():
    """Put every ledger target back after the test (activation mutates vLLM modules)."""
    saved = []
    for entry in ledger.LEDGER:
        for path in entry.targets:
            module, attr = _target(path)
            saved.append((module, attr, getattr(module, attr)))
    yield
    for module, attr, value in saved:
        setattr(module, attr, value)
    from vllm.triton_utils import dispatcher

    for entry in ledger.LEDGER:
        if entry.level == "kernel":
            for path in entry.targets:
                dispatcher._registry.pop(path.replace(":", "."), None)


def _bound(module, attr):
    """What a target now routes to: the function itself, or a kernel override's impl."""
    value = getattr(module, attr)
    return getattr(value, "_impl", value)


def _ours(entry):
    return _target(entry.replacement)[0].__dict__[entry.replacement.partition(":")[2]]


def test_entry_point_is_discoverable_and_vllm_loads_it(tmp_path):
    from importlib.metadata import entry_points

    values = [e.value for e in entry_points(group="vllm.general_plugins")]
    assert "deepinfer_sm80.vllm_plugin:register" in values
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "DEEPINFER_FORCE": "1",
        "DEEPINFER_RUNTIME_DIR": str(tmp_path),
    }
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "import vllm.models.deepseek_v41.nvidia.flashmla as f, deepinfer_sm80.ops.kv_cache as k; "
        "print(f.dequantize_and_gather_k_cache is k.dequantize_and_gather_k_cache)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "True"
    status = json.loads((tmp_path / "plugin-status.json").read_text())
    assert status["active"] and status["patches"]["kv-gather"] == "applied: 4 sites"


def test_forced_activation_patches_every_target_with_the_same_signature(restore_vllm, tmp_path):
    status = apply.activate(
        {"DEEPINFER_FORCE": "1", "DEEPINFER_RUNTIME_DIR": str(tmp_path)}, capabilities=[]
    )
    assert status["active"]
    for entry in ledger.LEDGER:
        ours = _ours(entry)
        for path in entry.targets:
            module, attr = _target(path)
            assert _bound(module, attr) is ours, path
        assert status["patches"][entry.name] == f"applied: {len(entry.targets)} sites"
    # Idempotent: a second activation finds everything already ours and changes nothing.
    again = apply.activate(
        {"DEEPINFER_FORCE": "1", "DEEPINFER_RUNTIME_DIR": str(tmp_path)}, capabilities=[]
    )
    assert again["patches"] == status["patches"]


def test_signatures_match_before_patching(restore_vllm):
    for entry, sites, replacement in apply.plan_patches(list(ledger.LEDGER)):
        for module, attr in sites:
            original = getattr(module, attr)
            theirs = (
                tuple(original.arg_names)
                if entry.level == "kernel"
                else tuple(inspect.signature(original).parameters)
            )
            assert theirs == tuple(inspect.signature(replacement).parameters)


@pytest.mark.parametrize(
    "env,caps,active",
    [
        ({}, [(8, 0), (8, 6)], True),
        ({}, [(9, 0)], False),
        ({}, [], False),
        ({"DEEPINFER_FORCE": "1"}, [(9, 0)], True),
        ({"DEEPINFER_DISABLE": "1"}, [(8, 0)], False),
    ],
)
def test_gates(restore_vllm, tmp_path, env, caps, active):
    gather_site, attr = _target(ledger.LEDGER[0].targets[2])
    before = getattr(gather_site, attr)
    status = apply.activate({**env, "DEEPINFER_RUNTIME_DIR": str(tmp_path)}, capabilities=caps)
    assert status["active"] is active
    assert (getattr(gather_site, attr) is not before) is active


def test_selection_applies_a_subset(restore_vllm, tmp_path):
    status = apply.activate(
        {
            "DEEPINFER_FORCE": "1",
            "DEEPINFER_PATCHES": "kv-gather",
            "DEEPINFER_RUNTIME_DIR": str(tmp_path),
        },
        capabilities=[],
    )
    assert status["patches"]["kv-gather"].startswith("applied")
    assert status["patches"]["topk-swa-combine"] == "skipped: not in DEEPINFER_PATCHES"
    with pytest.raises(apply.PluginError, match="unknown patches \\['nope'\\]"):
        apply.activate({"DEEPINFER_FORCE": "1", "DEEPINFER_PATCHES": "nope"}, capabilities=[])


def test_unverified_vllm_version_is_refused(restore_vllm, monkeypatch, tmp_path):
    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    env = {"DEEPINFER_FORCE": "1", "DEEPINFER_RUNTIME_DIR": str(tmp_path)}
    with pytest.raises(apply.PluginError, match=r"on vLLM 0\.33\.0\. Install vllm==0\.33\.0"):
        apply.activate(env, capabilities=[])
    assert apply.activate({**env, "DEEPINFER_ALLOW_VLLM_VERSION": "1"}, capabilities=[])["active"]


def test_missing_target_patches_nothing(restore_vllm, monkeypatch, tmp_path):
    broken = dataclasses.replace(
        ledger.LEDGER[-1],
        targets=(
            *ledger.LEDGER[-1].targets,
            "vllm.models.deepseek_v41.common.ops:no_such_function",
        ),
    )
    monkeypatch.setattr(apply, "LEDGER", (*ledger.LEDGER[:-1], broken))
    site, attr = _target(ledger.LEDGER[0].targets[0])
    before = getattr(site, attr)
    with pytest.raises(apply.PluginError, match=r"no attribute 'no_such_function'.*vLLM 0\.33\.0"):
        apply.activate(
            {"DEEPINFER_FORCE": "1", "DEEPINFER_RUNTIME_DIR": str(tmp_path)}, capabilities=[]
        )
    assert getattr(site, attr) is before  # the first entry was not applied either


def test_ledger_prints_without_vllm():
    code = (
        "import sys; from deepinfer_sm80.vllm_plugin.ledger import format_ledger; "
        "print(format_ledger()); print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False") and "kv-gather" in out.stdout


def test_aot_seeding_is_optional_and_never_raises(tmp_path, caplog):
    from deepinfer_sm80.triton_launch_compile import build_id
    from deepinfer_sm80.vllm_plugin.apply import seed_aot_kernels

    assert seed_aot_kernels({}) == {}
    src = tmp_path / "kernels" / "triton" / "entry"
    src.mkdir(parents=True)
    (src / "k.cubin").write_bytes(b"x")
    manifest = tmp_path / "kernels" / "manifest.json"
    manifest.write_text(json.dumps({"triton_build": build_id()}))
    # TileLang's parts too (aot.py: mhc/, sparse_mla/, vllm_mhc/ tilelang), into its cache
    for part in ("mhc", "sparse_mla", "vllm_mhc"):
        entry = tmp_path / "kernels" / part / "tilelang" / f"{part}-key"
        entry.mkdir(parents=True)
        (entry / "kernel.cubin").write_bytes(b"y")
    cache, tl_cache = tmp_path / "cache", tmp_path / "tl-cache"
    env = {
        "DEEPINFER_AOT_DIR": str(tmp_path / "kernels"),
        "TRITON_CACHE_DIR": str(cache),
        "TILELANG_CACHE_DIR": str(tl_cache),
    }
    assert seed_aot_kernels(env) == {"triton": 1, "mhc": 1, "sparse_mla": 1, "vllm_mhc": 1}
    assert (cache / "entry" / "k.cubin").exists()
    assert (tl_cache / "mhc-key" / "kernel.cubin").read_bytes() == b"y"
    assert (tl_cache / "sparse_mla-key" / "kernel.cubin").exists()
    assert (tl_cache / "vllm_mhc-key" / "kernel.cubin").exists()
    never_twice = {"triton": 0, "mhc": 0, "sparse_mla": 0, "vllm_mhc": 0}
    assert seed_aot_kernels(env) == never_twice
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert seed_aot_kernels({**env, "TRITON_CACHE_DIR": str(blocked)})["triton"] == 0
    # Entries of another Triton build are not copied (a warning says why); TileLang's still are
    manifest.write_text(json.dumps({"triton_build": {**build_id(), "python": "3.99"}}))
    fresh = {
        **env,
        "TRITON_CACHE_DIR": str(tmp_path / "c2"),
        "TILELANG_CACHE_DIR": str(tmp_path / "t2"),
    }
    with caplog.at_level("WARNING", logger="deepinfer_sm80"):
        assert seed_aot_kernels(fresh) == {"triton": 0, "mhc": 1, "sparse_mla": 1, "vllm_mhc": 1}
    assert "Python 3.99" in caplog.text and "Rebuild the folder" in caplog.text
    assert not (tmp_path / "c2" / "entry").exists()


def test_activation_seeds_tilelang_before_any_forward_and_records_it(restore_vllm, tmp_path):
    """The TileLang caches are seeded when the plugin activates (every vLLM process,
    before the profiling run), and the status file says what was copied."""
    entry = tmp_path / "kernels" / "sparse_mla" / "tilelang" / "key"
    entry.mkdir(parents=True)
    (entry / "kernel.cubin").write_bytes(b"z")
    env = {
        "DEEPINFER_FORCE": "1",
        "DEEPINFER_AOT_DIR": str(tmp_path / "kernels"),
        "TILELANG_CACHE_DIR": str(tmp_path / "tl-cache"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton-cache"),
        "DEEPINFER_RUNTIME_DIR": str(tmp_path / "run"),
    }
    status = apply.activate(env)
    assert (tmp_path / "tl-cache" / "key" / "kernel.cubin").exists()
    assert status["aot_seeded"]["sparse_mla"] == 1
    written = json.loads((tmp_path / "run" / "plugin-status.json").read_text())
    assert written["aot_seeded"] == {"triton": 0, "mhc": 0, "sparse_mla": 1, "vllm_mhc": 0}


def test_kernel_level_entry_goes_through_register_kernels(tmp_path):
    """engram-lookup: vLLM's Triton kernel becomes a KernelOverride routing to ours, its
    launch arguments checked by name first; a second activation changes nothing."""
    from vllm.models.deepseek_v41.common import engram as v41_engram
    from vllm.triton_utils import dispatcher

    from deepinfer_sm80.ops.engram import engram_lookup_kernel_override
    from deepinfer_sm80.vllm_plugin import apply, ledger

    entry = next(e for e in ledger.LEDGER if e.name == "engram-lookup")
    assert entry.level == "kernel"
    original = v41_engram._engram_lookup_kernel
    env = {
        "DEEPINFER_FORCE": "1",
        "DEEPINFER_PATCHES": "engram-lookup",
        "DEEPINFER_RUNTIME_DIR": str(tmp_path),
    }
    try:
        status = apply.activate(env, capabilities=[])
        assert status["patches"]["engram-lookup"] == "applied: 1 sites"
        wrapped = v41_engram._engram_lookup_kernel
        assert isinstance(wrapped, dispatcher.KernelOverride)
        assert wrapped._impl is engram_lookup_kernel_override
        apply.activate(env, capabilities=[])
        assert v41_engram._engram_lookup_kernel is wrapped
    finally:
        v41_engram._engram_lookup_kernel = original
        dispatcher._registry.pop(
            "vllm.models.deepseek_v41.common.engram._engram_lookup_kernel", None
        )


def test_kernel_level_entry_refuses_mismatched_arguments():
    import dataclasses

    import pytest

    from deepinfer_sm80.vllm_plugin import apply, ledger

    entry = next(e for e in ledger.LEDGER if e.name == "engram-lookup")
    wrong = dataclasses.replace(entry, replacement="deepinfer_sm80.ops.fp8.ref:e4m3_decode_ref")
    with pytest.raises(apply.PluginError, match="takes"):
        apply.plan_patches([wrong])


def test_fp8_wo_a_setting_is_refused_on_ampere(tmp_path):
    """With wo_a kept in fp8, vLLM's o_proj goes to DeepGEMM (sm90+): refuse, say why."""
    import pytest

    from deepinfer_sm80.vllm_plugin import apply

    env = {
        "DEEPINFER_FORCE": "1",
        "DEEPINFER_RUNTIME_DIR": str(tmp_path),
        "VLLM_MXFP8_EMULATION_DEQUANT_AT_LOAD": "0",
    }
    with pytest.raises(apply.PluginError, match="fp8_einsum, which needs sm90"):
        apply.activate(env, capabilities=[])
