"""The start steps read from a server's log (benchmarks/e2e/start_timeline.py), on lines
as vLLM 0.33.0 and the plugin printed them in an H100 cold start."""

from benchmarks.e2e import start_timeline

COLD_START_LOG = """\
INFO 2026-12-07 14:30:25,874 [deepinfer_sm80] deepinfer-sm80: seeded AOT kernels from /root/aot: {'triton': 54, 'mhc': 35, 'sparse_mla': 60}
INFO 12-07 14:31:44 [core.py:139] Initializing a V1 LLM engine (v0.33.0) with config: model='/root/smoke'
INFO 2026-12-07 14:31:44,439 [deepinfer_sm80] deepinfer-sm80: seeded AOT kernels from /root/aot: {'triton': 0, 'mhc': 0, 'sparse_mla': 0}
INFO 12-07 14:32:06 [model_runner.py:428] Model loading took 8.78 GiB memory and 21.275484 seconds
INFO 12-07 14:35:40 [model_runner.py:1163] Graph capturing finished in 78 secs, took 2.12 GiB
INFO 12-07 14:35:41 [kernel_warmup.py:179] JIT kernel warmup starting.
INFO 12-07 14:37:11 [kernel_warmup.py:192] JIT kernel warmup finished in 89.87s.
INFO 12-07 14:37:40 [model_runner.py:1163] Graph capturing finished in 17 secs, took 1.07 GiB
INFO 12-07 14:37:41 [core.py:412] init engine (profile, create kv cache, warmup model) took 335.15 s
INFO 12-07 14:37:43 [entry.py:139] Starting vLLM server on http://127.0.0.1:8000
WARNING 12-07 14:37:46 [jit_monitor.py:140] Triton kernel JIT compilation during inference: _prepare_dflash_inputs_kernel. This causes a latency spike; consider extending warmup to cover this shape/config.
WARNING 12-07 14:37:54 [jit_monitor.py:140] Triton kernel JIT compilation during inference: mqa_logits_prefill_kernel. This causes a latency spike; consider extending warmup to cover this shape/config.
"""  # noqa: E501


def test_the_steps_of_a_cold_start_are_read_from_its_log():
    t = start_timeline.parse(COLD_START_LOG)
    assert t == {
        "model_loading_s": 21.275484,
        "graph_capture_s": 95.0,  # the target's 78 s and the draft's 17 s
        "graph_captures": 2,
        "jit_warmup_s": 89.87,
        "init_engine_s": 335.15,
        "aot_seeded": {"triton": 54, "mhc": 35, "sparse_mla": 60},  # the first count
        "jit_compiled_while_serving": [
            "_prepare_dflash_inputs_kernel",
            "mqa_logits_prefill_kernel",
        ],
    }
    line = start_timeline.summary(t)
    assert line.startswith("model loading 21 s; graph capture 95 s (2 captures); JIT warmup 90 s;")
    assert line.endswith("Triton JIT while serving: _prepare_dflash_inputs_kernel, "
                         "mqa_logits_prefill_kernel")  # fmt: skip


def test_a_step_the_log_does_not_name_is_left_out_not_zero():
    t = start_timeline.parse(
        "INFO 12-07 14:42:43 [gpu_worker.py:676] reserved 6.0 GiB memory for KV Cache\n"
        "INFO 12-07 14:45:06 [core.py:412] init engine (profile, create kv cache, warmup "
        "model) took 256.07 s (compilation: 41.50 s)\n"
    )
    assert t == {"init_engine_s": 256.07}
    assert (
        start_timeline.summary(t)
        == "engine init in all 256 s; Triton JIT while serving: none logged"
    )
    assert start_timeline.parse("") == {}


def test_torch_compiles_total_is_read():
    t = start_timeline.parse(
        "INFO 12-07 10:00:00 [monitor.py:20] torch.compile took 41.50 s in total\n"
    )
    assert t == {"torch_compile_s": 41.5}
