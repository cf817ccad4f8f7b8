"""The typed schema of a topology file (``configs/topologies/*.yaml``).

Every field has a docstring (exported as its description in the JSON schema); unknown
keys are errors, so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class Gpus(_Strict):
    count: int = Field(gt=0)
    """GPUs this topology uses on each node (the whole layout when it spans one node)."""
    kind: str = "A100-80GB"
    """GPU model it is written for (A100-80GB, A100-40GB, GA100-64GB, A800-80GB, RTX3090,
    A6000, A40, ...)."""


class Parallel(_Strict):
    tensor_parallel: int | list[int] = Field(default=1)
    """Tensor-parallel size; a list gives one size per pipeline stage (asymmetric
    layouts, which vLLM 0.33.0 cannot launch: plan-only)."""
    pipeline_parallel: int = Field(default=1, gt=0)
    """Pipeline stages."""
    partition: list[int] | None = None
    """Decoder layers per stage (VLLM_PP_LAYER_PARTITION); required when
    pipeline_parallel > 1, one entry per stage, summing to 40."""


class Nodes(_Strict):
    count: int = Field(default=1, gt=0)
    """Nodes one server spans. Above 1, vLLM's own multi-node mode runs: the same
    ``vllm serve`` on every node, ranks laid out tensor-parallel first, node by node."""
    backend: Literal["mp", "ray"] = "mp"
    """mp: vLLM's native multiprocessing (--nnodes/--node-rank, --headless on nodes > 0);
    ray: one ``vllm serve`` on the head of a Ray cluster the operator started (Ray is not
    in vLLM 0.33.0's dependencies: the image must add it)."""
    master_port: int = Field(default=29501, gt=0, lt=65536)
    """Port on node 0 the other nodes' workers connect to (--master-port). The address
    is per-deployment: MASTER_ADDR in each node's .env."""


class Speculative(_Strict):
    method: Literal["dspark", "none"] = "dspark"
    """Speculative decoding: DSpark (DeepSeek-V4.1's draft layers) or none."""
    num_speculative_tokens: int = Field(default=5, gt=0)
    """Draft tokens per step (K). Ampere supports K <= 5."""
    rejection_sample_method: Literal["standard", "synthetic", "block", "fly"] = "block"
    """vLLM's rejection sampler for DSpark (the recipes use "block")."""
    adaptive_verification: bool = False
    """DSpark adaptive verification; vLLM 0.33.0 rejects it with PP > 1 (rendered off)."""


class Topology(_Strict):
    name: str
    """Short name, matching the file name."""
    description: str = ""
    """One line for people choosing a topology."""
    model: str = "deepseek-ai/DeepSeek-V4.1-Flash"
    """Hugging Face repository id or local path of the checkpoint."""
    served_model_name: str = "deepseek-v4.1-flash"
    """Name clients use in the OpenAI API."""
    gpus: Gpus
    """The GPUs of each node."""
    nodes: Nodes = Nodes()
    """How many nodes one server spans (multi-node)."""
    replicas: int = Field(default=1, gt=0)
    """Independent copies of the whole server, one per node (group), behind a router for
    throughput; each replica is started on its own node with the same file."""
    parallel: Parallel = Parallel()
    """Tensor / pipeline layout."""
    max_model_len: int = Field(default=1_048_576, gt=0, le=1_048_576)
    """Context length; DeepSeek-V4.1's maximum is 1,048,576 positions."""
    kv_cache_dtype: Literal["fp8"] = "fp8"
    """KV cache format: fp8 (the 584-byte V4 record on Ampere)."""
    gpu_memory_utilization: float = Field(default=0.75, gt=0, le=0.98)
    """Fraction of each GPU's memory vLLM may use."""
    max_num_seqs: int = Field(default=16, gt=0)
    """Concurrent sequences."""
    max_num_batched_tokens: int = Field(default=8192, gt=0)
    """Tokens per scheduler step (prefill chunk size)."""
    speculative: Speculative = Speculative()
    """Speculative decoding settings."""
    decode_splits: Literal["latency", "throughput"] = "latency"
    """Split policy of the sparse-MLA decode kernels (DEEPINFER_SPARSE_MLA_DECODE_SPLITS).
    latency: each token's 640 selected rows in 4 splits, fastest for small batches.
    throughput: one split per token, faster for large batches, about 2x slower for small
    ones; README "Serve" has the H200 (proxy) figures and crossover points per head
    count. Either way a token's bits do not depend on the batch."""
    engram_cpu_offload: bool = True
    """Keep the Engram tables (about 189 GiB) in pinned host memory."""
    vision: bool = False
    """Serve the vision encoder too. Off by default: not verified on Ampere."""
    host: str = "127.0.0.1"
    """Address the API server binds; loopback unless you mean to expose it."""
    port: int = Field(default=8000, gt=0, lt=65536)
    """API server port."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for vLLM."""
    extra_vllm_args: list[str] = Field(default_factory=list)
    """Flags appended verbatim to ``vllm serve`` (escape hatch)."""
