"""Who was measured: model, vLLM version, GPUs and the plugin's patch selection.

Sources, each optional except the model list:
- ``GET /v1/models``: served model id, its root (path or repo) and ``max_model_len``.
- ``GET /version``: the vLLM version.
- ``GET /server_info?config_format=json``: only when the server runs with
  ``VLLM_SERVER_DEV_MODE=1``; gives the GPU models (``system_env.nvidia_gpu_models``) and
  the parallel and speculative configuration.
- ``nvidia-smi`` on this machine when the URL is a loopback address and the server did not
  say (same host assumed, and labelled so).
- The patch selection: what the user declares (``--patches``, the ``DEEPINFER_PATCHES`` the
  server was started with) and, better, the plugin's own status file
  (``plugin-status.json``, written by ``deepinfer_sm80.vllm_plugin`` in the server's
  ``DEEPINFER_RUNTIME_DIR``; ``/run/deepinfer`` in our image) given with ``--plugin-status``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

from benchmarks.serving.client import Client, ServerError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _dig(obj, *path):
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def server_info_subset(info: dict) -> dict:
    cfg = info.get("vllm_config")
    if isinstance(cfg, str):
        cfg = None
    spec = _dig(cfg, "speculative_config")
    return {
        "gpu": _dig(info, "system_env", "nvidia_gpu_models"),
        "cuda_driver": _dig(info, "system_env", "nvidia_driver_version"),
        "tensor_parallel_size": _dig(cfg, "parallel_config", "tensor_parallel_size"),
        "pipeline_parallel_size": _dig(cfg, "parallel_config", "pipeline_parallel_size"),
        "data_parallel_size": _dig(cfg, "parallel_config", "data_parallel_size"),
        "speculative_method": _dig(spec, "method"),
        "num_speculative_tokens": _dig(spec, "num_speculative_tokens"),
        "kv_cache_dtype": _dig(cfg, "cache_config", "cache_dtype"),
        "max_num_batched_tokens": _dig(cfg, "scheduler_config", "max_num_batched_tokens"),
        "vllm_env": info.get("vllm_env"),
    }


def local_gpus() -> list[str] | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def collect(
    client: Client,
    model: str | None,
    *,
    label: str | None,
    patches: str | None,
    plugin_status: Path | None,
) -> dict:
    models = client.get_json("/v1/models").get("data") or []
    if not models:
        raise ServerError(200, "/v1/models", "the server lists no model")
    ids = [m.get("id") for m in models]
    if model is None:
        model = ids[0]
    elif model not in ids:
        raise ValueError(f"--model {model!r} is not served; the server lists {ids}")
    card = next(m for m in models if m.get("id") == model)
    ident: dict = {
        "label": label,
        "url": client.base_url,
        "model": model,
        "model_root": card.get("root"),
        "max_model_len": card.get("max_model_len"),
        "served_models": ids,
    }
    try:
        ident["version"] = client.get_json("/version").get("version")
    except (ServerError, OSError, ValueError):
        ident["version"] = None
    info_text = None
    with contextlib.suppress(ServerError, OSError):
        info_text = client.get_text("/server_info?config_format=json")
    if info_text:
        try:
            ident["server_info"] = server_info_subset(json.loads(info_text))
        except ValueError:
            ident["server_info"] = None
    gpu = _dig(ident, "server_info", "gpu")
    if gpu:
        ident["gpu"], ident["gpu_source"] = gpu, "/server_info"
    elif client.host in LOOPBACK and (gpus := local_gpus()):
        ident["gpu"], ident["gpu_source"] = gpus, "nvidia-smi on this host (same host assumed)"
    else:
        ident["gpu"], ident["gpu_source"] = None, "not exposed by the server"
    ident["patches_declared"] = patches
    if plugin_status is not None:
        status = json.loads(Path(plugin_status).read_text())
        ident["plugin_status"] = {
            k: status.get(k) for k in ("active", "reason", "verified_vllm", "patches")
        }
    else:
        ident["plugin_status"] = None
    return ident


def patch_summary(ident: dict) -> str:
    status = ident.get("plugin_status")
    if status and isinstance(status.get("patches"), dict):
        applied = [n for n, s in status["patches"].items() if str(s).startswith("applied")]
        state = "active" if status.get("active") else "inactive"
        return f"plugin {state}: " + (",".join(applied) or "no patches applied")
    declared = ident.get("patches_declared")
    if declared is None:
        return "patch selection not recorded"
    return f"declared DEEPINFER_PATCHES={declared!r}" + (" (all)" if declared == "" else "")
