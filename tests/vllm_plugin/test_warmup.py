"""The kernel-warmup ledger entry: our mHC variants compile before vLLM's own warmup."""

from types import SimpleNamespace

import pytest

from tools.tiers import import_or_skip

pytestmark = pytest.mark.vllm
import_or_skip("vllm")


def _runner(max_tokens=8192):
    hf = SimpleNamespace(rms_norm_eps=1e-6, hc_eps=1e-5, hc_sinkhorn_iters=7)
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
        model_config=SimpleNamespace(hf_config=hf),
    )


def test_ours_runs_first_then_vllms(monkeypatch):
    from deepinfer_sm80.vllm_plugin import warmup

    calls = []
    from deepinfer_sm80.vllm_plugin import pp_broadcast

    monkeypatch.setattr(warmup, "warm_overlay_kernels", lambda r: calls.append(("ours", r)))
    monkeypatch.setattr(
        pp_broadcast, "prewarm_post_update", lambda r: calls.append(("pp post-update", r))
    )
    monkeypatch.setattr(
        warmup, "_vllm_warmup_kernels", lambda r, e, s: calls.append(("vllm", r, e, s))
    )
    runner = _runner()
    warmup.warmup_kernels(runner, "exec", "sample")
    assert calls == [
        ("ours", runner),
        ("pp post-update", runner),
        ("vllm", runner, "exec", "sample"),
    ]


def test_mhc_warmup_gets_the_servers_sizes_model_constants_and_aot_folder(monkeypatch, tmp_path):
    from deepinfer_sm80.ops.mhc import warmup as mhc_warmup
    from deepinfer_sm80.vllm_plugin import warmup

    seen = {}

    def fake_prepare(max_tokens, aot_dir=None, model=None, log=None):
        seen.update(max_tokens=max_tokens, aot_dir=aot_dir, model=model)
        return [{"variant": "x"}]

    monkeypatch.setattr(mhc_warmup, "prepare_mhc_kernels", fake_prepare)
    (tmp_path / "mhc").mkdir()
    monkeypatch.setenv("DEEPINFER_AOT_DIR", str(tmp_path))
    assert warmup.warm_overlay_kernels(_runner(4096)) == [{"variant": "x"}]
    assert seen["max_tokens"] == 4096 and seen["aot_dir"] == tmp_path / "mhc"
    assert (seen["model"].rms_norm_eps, seen["model"].hc_eps) == (1e-6, 1e-5)
    assert seen["model"].sinkhorn_iters == 7
    # A folder that is not there is passed on as it is: seeding skips it
    # (test_aot.py::test_warm_seeds_only_from_an_aot_folder_that_exists).
    monkeypatch.setenv("DEEPINFER_AOT_DIR", str(tmp_path / "absent"))
    warmup.warm_overlay_kernels(_runner())
    assert seen["aot_dir"] == tmp_path / "absent" / "mhc"
    monkeypatch.delenv("DEEPINFER_AOT_DIR")
    warmup.warm_overlay_kernels(_runner())
    assert seen["aot_dir"] is None


def test_sparse_mla_decode_kernels_warm_where_the_tilelang_decode_runs(monkeypatch):
    from deepinfer_sm80.ops.mhc import warmup as mhc_warmup
    from deepinfer_sm80.ops.sparse_mla import engine, tilelang_kernels
    from deepinfer_sm80.vllm_plugin import warmup

    monkeypatch.setattr(mhc_warmup, "prepare_mhc_kernels", lambda *a, **k: [{"variant": "m"}])
    seen = {}

    def fake_warmup(log, aot_dir=None):
        seen["aot_dir"] = aot_dir
        return [{"variant": "d"}]

    monkeypatch.setattr(tilelang_kernels, "warmup", fake_warmup)
    reserved = []
    monkeypatch.setattr(
        tilelang_kernels, "reserve_split_counters", lambda d, n: reserved.append((d.type, n))
    )
    monkeypatch.setenv("DEEPINFER_AOT_DIR", "/opt/kernels")
    # This machine (CPU, interpreter): the Triton decode runs, nothing to compile.
    assert warmup.warm_overlay_kernels(_runner()) == [{"variant": "m"}]
    monkeypatch.setattr(engine, "decode_engine", lambda device: "tilelang")
    assert warmup.warm_overlay_kernels(_runner()) == [{"variant": "m"}, {"variant": "d"}]
    assert str(seen["aot_dir"]) == "/opt/kernels/sparse_mla"
    # The in-kernel split merge's counters, sized for the largest batch before any capture.
    assert reserved == [("cpu", _runner().scheduler_config.max_num_batched_tokens)]
    # TileLang prefill alone (decode forced to Triton): its kernels compile, no counters.
    monkeypatch.setattr(engine, "decode_engine", lambda device: "triton")
    monkeypatch.setattr(engine, "prefill_engine", lambda device: "tilelang")
    assert warmup.warm_overlay_kernels(_runner()) == [{"variant": "m"}, {"variant": "d"}]
    assert len(reserved) == 1
