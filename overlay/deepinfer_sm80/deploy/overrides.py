"""What ``env:`` and ``extra_vllm_args:`` may not touch: every variable and flag the
launcher renders from a validated field. They are applied after validation, so letting
them through would launch something other than what was checked and printed (a
partition that cuts a sharing group, K=8, a 4M context, TP 3, ``--host 0.0.0.0``).
"""

from __future__ import annotations

from pathlib import Path

from deepinfer_sm80.deploy.schema import Topology

# Variable -> the field (or setting) that decides it.
# (The relay opt-in and the decode-split variable have their own messages in validate().)
RENDERED_ENV = {
    "VLLM_PP_LAYER_PARTITION": "parallel.partition",
    "VLLM_ENGINE_READY_TIMEOUT_S": "the launcher (weight loading outlasts vLLM's default)",
    "VLLM_HOST_IP": "VLLM_HOST_IP in the node's .env (--host-ip)",
    "VLLM_API_KEY": "VLLM_API_KEY in .env (a secret: never in the topology file)",
}

# Flag -> the field that decides it. vLLM also accepts underscores for dashes and unique
# prefixes, so both are normalized before the lookup.
RENDERED_FLAGS = {
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--host": "host (the listen address: DEEPINFER_LISTEN_HOST in a container)",
    "--port": "port",
    "--tensor-parallel-size": "parallel.tensor_parallel",
    "-tp": "parallel.tensor_parallel",
    "--pipeline-parallel-size": "parallel.pipeline_parallel",
    "-pp": "parallel.pipeline_parallel",
    "--max-model-len": "max_model_len",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--speculative-config": "speculative",
    "--engram-config": "engram_cpu_offload",
    "--tokenizer-mode": "the launcher (DeepSeek-V4.1's tokenizer)",
    "--reasoning-parser": "the launcher (DeepSeek-V4.1's parser)",
    "--tool-call-parser": "the launcher (DeepSeek-V4.1's parser)",
    "--enable-auto-tool-choice": "the launcher",
    "--language-model-only": "vision",
    "--nnodes": "nodes.count",
    "--node-rank": "NODE_RANK in the node's .env",
    "--master-addr": "MASTER_ADDR in the node's .env",
    "--master-port": "nodes.master_port",
    "--headless": "the node's rank",
    "--distributed-executor-backend": "nodes.backend",
    "--distributed-timeout-seconds": "the launcher",
    "--api-key": "VLLM_API_KEY in .env (a secret: never in argv)",
    "--config": "the topology file itself (a vLLM config file could set any of these)",
}
_MIN_PREFIX = 4  # "--ma" is already ambiguous to vLLM; shorter prefixes are not flags


def _normalized(arg: str) -> str | None:
    if not arg.startswith("-"):
        return None  # a value of the flag before it
    flag = arg.split("=", 1)[0]
    return flag[:2] + flag[2:].replace("_", "-") if flag.startswith("--") else flag


def overridden_flag(arg: str) -> str | None:
    """The rendered flag ``arg`` would set (directly, with ``=``, with underscores, or as
    an abbreviation vLLM's parser accepts), or None."""
    flag = _normalized(arg)
    if flag is None:
        return None
    if flag in RENDERED_FLAGS:
        return flag
    if flag.startswith("--") and len(flag) >= _MIN_PREFIX:
        return next((f for f in RENDERED_FLAGS if f.startswith(flag)), None)
    return None


def errors(topo: Topology, path: Path) -> list[str]:
    out = []
    for key in topo.env:
        if key in RENDERED_ENV:
            out.append(
                f"{path}: env.{key}: the launcher sets it from {RENDERED_ENV[key]}; remove it "
                "here (a value set after validation would launch something unchecked)"
            )
    for i, arg in enumerate(topo.extra_vllm_args):
        flag = overridden_flag(arg)
        if flag:
            shown = arg if len(arg) <= 40 else arg[:37] + "..."
            out.append(
                f"{path}: extra_vllm_args[{i}]: {shown!r} overrides {flag}, which the launcher "
                f"renders from {RENDERED_FLAGS[flag]}; set that instead"
            )
    return out
