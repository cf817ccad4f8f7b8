"""Every shipped Triton kernel config, for the sm80/sm86 fitness tier and the plugin.

Each op module exposes ``ampere_kernel_specs()``; a new op adds its module here.
"""

import importlib

from deepinfer_sm80.kernel_spec import KernelSpec

OP_MODULES = (
    "deepinfer_sm80.ops.kv_cache.triton_kernel",
    "deepinfer_sm80.ops.topk_swa.triton_kernel",
    "deepinfer_sm80.ops.sparse_mla.triton_kernel",
    "deepinfer_sm80.ops.indexer_logits.triton_kernel",
    "deepinfer_sm80.ops.engram.triton_kernel",
    "deepinfer_sm80.ops.cache_writers.triton_kernel",
    "deepinfer_sm80.ops.indexer_q.triton_kernel",
    "deepinfer_sm80.ops.inv_rope.triton_kernel",
)


def all_ampere_kernel_specs() -> list[KernelSpec]:
    specs: list[KernelSpec] = []
    for name in OP_MODULES:
        specs.extend(importlib.import_module(name).ampere_kernel_specs())
    return specs
