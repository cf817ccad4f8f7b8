"""Render a validated topology into the exact ``vllm serve`` argv and environment.

A pure function: ``render`` returns the command, the environment additions and every
derived decision with its reason; ``launch`` in ``cli.py`` then ``exec``s it (no
shell). Secrets (the API key) travel in the environment, never in argv.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from deepinfer_sm80.deploy.schema import Topology

ENGINE_READY_TIMEOUT_S = 3600  # loading ~475 GiB of weights takes long (vLLM recipes)


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    decisions: list[tuple[str, str]] = field(default_factory=list)


def render(topo: Topology) -> LaunchPlan:
    par = topo.parallel
    tp = par.tensor_parallel
    if isinstance(tp, list):
        raise ValueError("asymmetric tensor parallelism cannot be launched (plan-only)")
    decisions: list[tuple[str, str]] = []
    env: dict[str, str] = {}
    argv = [
        "vllm",
        "serve",
        topo.model,
        "--served-model-name",
        topo.served_model_name,
        "--host",
        topo.host,
        "--port",
        str(topo.port),
        "--tensor-parallel-size",
        str(tp),
        "--pipeline-parallel-size",
        str(par.pipeline_parallel),
    ]
    if par.pipeline_parallel > 1:
        env["VLLM_PP_LAYER_PARTITION"] = ",".join(map(str, par.partition))
        decisions.append(
            (
                "VLLM_PP_LAYER_PARTITION=" + env["VLLM_PP_LAYER_PARTITION"],
                "vLLM's default even split cuts DeepSeek-V4.1's sharing groups",
            )
        )
    argv += [
        "--max-model-len",
        str(topo.max_model_len),
        "--kv-cache-dtype",
        topo.kv_cache_dtype,
        "--gpu-memory-utilization",
        f"{topo.gpu_memory_utilization:g}",
        "--max-num-seqs",
        str(topo.max_num_seqs),
        "--max-num-batched-tokens",
        str(topo.max_num_batched_tokens),
    ]
    decisions.append(
        (
            f"--kv-cache-dtype {topo.kv_cache_dtype}",
            "vLLM maps it to fp8_ds_mla: the 584-byte V4 record on Ampere",
        )
    )
    spec = topo.speculative
    if spec.method == "dspark":
        adaptive = spec.adaptive_verification
        if adaptive and par.pipeline_parallel > 1:
            adaptive = False
            decisions.append(
                (
                    "enable_adaptive_verification=false",
                    "vLLM 0.33.0 rejects adaptive verification with PP > 1",
                )
            )
        cfg = {
            "method": "dspark",
            "num_speculative_tokens": spec.num_speculative_tokens,
            "rejection_sample_method": spec.rejection_sample_method,
            "enable_adaptive_verification": adaptive,
        }
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
        decisions.append(
            (
                f"DSpark K={spec.num_speculative_tokens}",
                "speculative decoding with DeepSeek-V4.1's draft layers",
            )
        )
    argv += [
        "--engram-config",
        json.dumps({"cpu_offload": topo.engram_cpu_offload}, separators=(",", ":")),
    ]
    if topo.engram_cpu_offload:
        decisions.append(
            ("Engram tables in host memory", "about 189 GiB that would otherwise take GPU memory")
        )
    argv += [
        "--tokenizer-mode",
        "deepseek_v41",
        "--reasoning-parser",
        "deepseek_v41",
        "--tool-call-parser",
        "deepseek_v41",
        "--enable-auto-tool-choice",
    ]
    if not topo.vision:
        argv.append("--language-model-only")
        decisions.append(
            (
                "--language-model-only",
                "the vision encoder is not verified on Ampere (vision: false)",
            )
        )
    env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(ENGINE_READY_TIMEOUT_S)
    decisions.append(
        (
            f"VLLM_ENGINE_READY_TIMEOUT_S={ENGINE_READY_TIMEOUT_S}",
            "weight loading outlasts vLLM's default engine start timeout",
        )
    )
    if topo.host not in ("127.0.0.1", "localhost", "::1"):
        decisions.append(
            (
                f"--host {topo.host}",
                "listening beyond loopback as configured; set VLLM_API_KEY to require a key",
            )
        )
    env.update(topo.env)
    argv += topo.extra_vllm_args
    return LaunchPlan(argv, env, decisions)
