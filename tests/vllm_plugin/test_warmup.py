"""The kernel-warmup ledger entry: our mHC variants compile before vLLM's own warmup, one long
prefill after it."""

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
    monkeypatch.setattr(
        warmup, "warm_long_prefill", lambda r, e, s: calls.append(("long prefill", r, e, s))
    )
    runner = _runner()
    warmup.warmup_kernels(runner, "exec", "sample")
    assert calls == [
        ("ours", runner),
        ("pp post-update", runner),
        ("vllm", runner, "exec", "sample"),
        ("long prefill", runner, "exec", "sample"),
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


# DeepSeek-V4.1's geometry: index top-k 512, ratios 0/1/2, window 128.
_V41 = SimpleNamespace(
    index_topk=512, compress_ratios=[0, 0] + [2] * 18 + [1] * 20 + [0] * 3, sliding_window=128
)


def _long_runner(max_tokens=8192, max_model_len=1 << 20, hf=_V41, vocab=129280):
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
        model_config=SimpleNamespace(hf_config=hf, get_vocab_size=lambda: vocab),
        max_model_len=max_model_len,
    )


def test_long_prefill_crosses_the_indexers_select_everything_threshold():
    from deepinfer_sm80.vllm_plugin.warmup import long_prefill_tokens

    n = long_prefill_tokens(_V41)
    assert n == 512 * 2 + 2 + 128
    # vLLM scores with the indexer once seq_len // ratio > index_topk, at every ratio.
    for ratio in (1, 2):
        assert n // ratio > 512
        assert (n - 128) // ratio > 512  # and still without the window on top
    assert (n - 128 - 2) // 2 == 512  # one compressed entry less would not score
    tiny = SimpleNamespace(index_topk=64, compress_ratios=[0, 0, 2, 2, 1, 1, 0], sliding_window=128)
    assert long_prefill_tokens(tiny) == 64 * 2 + 2 + 128
    assert long_prefill_tokens(SimpleNamespace(index_topk=512, compress_ratios=[0, 0])) == 0
    assert long_prefill_tokens(SimpleNamespace()) == 0


def test_long_prefill_runs_one_mixed_step_with_room_for_the_decode_token(monkeypatch):
    from deepinfer_sm80.vllm_plugin import warmup

    seen = []

    def fake_mixed(runner, execute, sample, num_tokens, *, req_id_prefix):
        seen.append((runner, execute, sample, num_tokens, req_id_prefix))
        return True

    monkeypatch.setattr(warmup, "run_mixed_prefill_decode_warmup", fake_mixed)
    runner = _long_runner()
    assert warmup.warm_long_prefill(runner, "exec", "sample") == 1154 + 1
    assert seen == [(runner, "exec", "sample", 1155, "_deepinfer_long_prefill_warmup")]


@pytest.mark.parametrize(
    ("limits", "name"),
    [
        ({"max_tokens": 1024}, "max_num_batched_tokens >= 1155 and max_num_batched_tokens is 1024"),
        ({"max_model_len": 1100}, "max_model_len >= 1155 and max_model_len is 1100"),
        # The smoke checkpoint's vocabulary: vLLM's prefill ids 0..1153 would not embed.
        ({"vocab": 256}, "vocab_size >= 1154 and vocab_size is 256"),
    ],
)
def test_long_prefill_skips_with_the_limit_named_when_a_step_cannot_hold_it(
    monkeypatch, caplog, limits, name
):
    from deepinfer_sm80.vllm_plugin import warmup

    monkeypatch.setattr(
        warmup, "run_mixed_prefill_decode_warmup", lambda *a, **k: pytest.fail("must not run")
    )
    with caplog.at_level("WARNING", logger="deepinfer_sm80.warmup"):
        assert warmup.warm_long_prefill(_long_runner(**limits), "exec", "sample") == 0
    assert name in caplog.text and "over 1154 tokens" in caplog.text


def test_long_prefill_runs_at_a_vocabulary_just_large_enough(monkeypatch):
    from deepinfer_sm80.vllm_plugin import warmup

    monkeypatch.setattr(warmup, "run_mixed_prefill_decode_warmup", lambda *a, **k: True)
    assert warmup.warm_long_prefill(_long_runner(vocab=1154), "exec", "sample") == 1155
    assert warmup.warm_long_prefill(_long_runner(vocab=1153), "exec", "sample") == 0


def test_long_prefill_says_so_when_vllm_declines_the_mixed_step(monkeypatch, caplog):
    from deepinfer_sm80.vllm_plugin import warmup

    monkeypatch.setattr(warmup, "run_mixed_prefill_decode_warmup", lambda *a, **k: False)
    with caplog.at_level("WARNING", logger="deepinfer_sm80.warmup"):
        assert warmup.warm_long_prefill(_long_runner(), "exec", "sample") == 0
    assert "skipped by vLLM" in caplog.text and "over 1154 tokens" in caplog.text


def test_long_prefill_nothing_to_warm_without_compressed_layers(monkeypatch):
    from deepinfer_sm80.vllm_plugin import warmup

    monkeypatch.setattr(
        warmup, "run_mixed_prefill_decode_warmup", lambda *a, **k: pytest.fail("must not run")
    )
    hf = SimpleNamespace(index_topk=512, compress_ratios=[0] * 4, sliding_window=128)
    assert warmup.warm_long_prefill(_long_runner(hf=hf), "exec", "sample") == 0


def test_vllms_mixed_step_takes_the_arguments_the_long_prefill_passes():
    import inspect

    from vllm.v1.worker.gpu.warmup import run_mixed_prefill_decode_warmup

    sig = inspect.signature(run_mixed_prefill_decode_warmup)
    sig.bind("runner", "exec", "sample", 1155, req_id_prefix="_deepinfer_long_prefill_warmup")
    # The vocabulary limit rests on this: the prefill's token ids are 0 .. prefill - 1.
    source = inspect.getsource(run_mixed_prefill_decode_warmup)
    assert "prefill_len = num_tokens - decode_scheduled_tokens" in source
    assert "prefill_token_ids = list(range(prefill_len))" in source
