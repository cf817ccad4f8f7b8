"""vLLM general plugin: switch DeepSeek-V4.1 onto the Ampere kernels on SM8x.

``register()`` runs in every vLLM process (API server, engine core, workers) through the
``vllm.general_plugins`` entry point, before the model is built. It is idempotent and
cheap when inactive, and it never initializes CUDA: the compute capability is read
through NVML.

Environment:
- ``DEEPINFER_FORCE=1``: activate on any GPU (or none), to exercise the Ampere paths.
- ``DEEPINFER_DISABLE=1``: never activate.
- ``DEEPINFER_PATCHES=a,b``: apply only these ledger entries (names in ``ledger.py``).
- ``DEEPINFER_ALLOW_VLLM_VERSION=1``: accept a vLLM version the ledger was not verified on.
- ``DEEPINFER_RUNTIME_DIR``: where the status JSON goes (default: $TMPDIR/deepinfer).
- ``DEEPINFER_YOCO=0``: turn off the per-step reuse of index metadata across a KV-sharing
  group in the Ampere attention layer (``yoco.py``); on by default.
- ``DEEPINFER_AOT_DIR``: ahead-of-time Triton, mHC and sparse MLA kernels to seed the
  Triton and TileLang caches from (the image sets /opt/deepinfer/kernels; see
  ``deepinfer_sm80.aot``).

The pipeline relay (``pp_relay``) is wired but inert unless ``DEEPINFER_PP_RELAY=1``
(``model_topology.plugin_capabilities``; the launcher sets it for every worker when the
user opts in); it becomes a default once it has run on GPUs. The patch ledger
(``ledger.py``) lists what is switched. No run of DeepSeek-V4.1 on an Ampere GPU is
recorded here.
"""

from __future__ import annotations

import logging
import os

from deepinfer_sm80.vllm_plugin.apply import PluginError, activate

logger = logging.getLogger("deepinfer_sm80")

_state: dict[str, object] = {"done": False, "result": None}


def log_info_by_default() -> None:
    """Let the overlay's INFO lines (warmup: AOT files seeded, kernels ready and how long)
    reach the server log. vLLM configures only its own ``vllm`` loggers, so ours inherit
    the root's WARNING and a cold start could not say where its time went. A level set
    by the user (``logging`` config) is kept; without any handler anywhere, one to stderr,
    and then not also the root's (configured later, it would print every line twice)."""
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def register() -> None:
    """vLLM calls this in every process; the second call in a process does nothing."""
    if _state["done"]:
        return
    _state["done"] = True
    log_info_by_default()
    try:
        _state["result"] = activate(os.environ)
    except PluginError as exc:
        # A refusal must stop the server with the reason, not leave vLLM half-patched.
        logger.error("deepinfer-sm80: %s", exc)
        raise


__all__ = ["register"]
