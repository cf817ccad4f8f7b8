"""The typed schema of a topology file (``configs/topologies/*.yaml``).

Every field has a docstring (exported as its description in the JSON schema); unknown
keys are errors, so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.deploy import gpu_kinds

# Bounds that keep every number meaningful (and every derived list small): DeepSeek-V4.1
# has 64 attention heads and 40 decoder layers; the rest are sanity caps far above any
# Ampere deployment, so an extra digit is an error rather than a plan for 10^9 GPUs.
MAX_HEADS = mt.NUM_ATTENTION_HEADS
MAX_LAYERS = mt.NUM_LAYERS
MAX_GPUS_PER_NODE = 64
MAX_NODES = 64
TensorParallel = Annotated[int, Field(gt=0, le=MAX_HEADS)]
LayerCount = Annotated[int, Field(gt=0, le=MAX_LAYERS)]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class Gpus(_Strict):
    count: int = Field(gt=0, le=MAX_GPUS_PER_NODE)
    """GPUs this topology uses on each node (the whole layout when it spans one node)."""
    kind: str = "A100-80GB"
    """GPU model it is written for (A100-80GB, A100-40GB, GA100-64GB, A800-80GB, RTX3090,
    A6000, A40, ...); nvidia-smi's names (NVIDIA A100-SXM4-80GB) map to these."""

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        kind = gpu_kinds.canonical(value)
        if kind is None:
            raise ValueError(gpu_kinds.unknown_message(value))
        return kind


class Parallel(_Strict):
    tensor_parallel: (
        TensorParallel | Annotated[list[TensorParallel], Field(max_length=MAX_LAYERS)]
    ) = 1
    """Tensor-parallel size; a list gives one size per pipeline stage (asymmetric
    layouts, which vLLM 0.33.0 cannot launch: plan-only)."""
    pipeline_parallel: int = Field(default=1, gt=0, le=MAX_LAYERS)
    """Pipeline stages."""
    partition: Annotated[list[LayerCount], Field(max_length=MAX_LAYERS)] | None = None
    """Decoder layers per stage (VLLM_PP_LAYER_PARTITION); required when
    pipeline_parallel > 1, one entry per stage, summing to 40."""


class Nodes(_Strict):
    count: int = Field(default=1, gt=0, le=MAX_NODES)
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
    num_speculative_tokens: int = Field(default=5, gt=0, le=64)
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
    checkpoint: Literal["full", "smoke"] = "full"
    """full: the real DeepSeek-V4.1-Flash weights. smoke: the small checkpoint that
    ``deepinfer smoke-model`` writes (the real attention geometry, a small MoE, vocabulary
    and Engram tables); the planner then sizes its weights from
    configs/model/deepseek-v4.1-smoke.yaml."""
    served_model_name: str = "deepseek-v4.1-flash"
    """Name clients use in the OpenAI API."""
    gpus: Gpus
    """The GPUs of each node."""
    nodes: Nodes = Nodes()
    """How many nodes one server spans (multi-node)."""
    replicas: int = Field(default=1, gt=0, le=MAX_NODES)
    """Independent copies of the whole server, one per node (group), behind a router for
    throughput; each replica is started on its own node with the same file."""
    parallel: Parallel = Parallel()
    """Tensor / pipeline layout."""
    max_model_len: int = Field(default=1_048_576, gt=0, le=2**31 - 1)
    """Context length; at most the model's max_position_embeddings (1,048,576 for
    DeepSeek-V4.1; validation reads it from the model facts)."""
    kv_cache_dtype: Literal["fp8"] = "fp8"
    """KV cache format: fp8 (the 584-byte V4 record on Ampere)."""
    gpu_memory_utilization: float = Field(default=0.75, gt=0, le=0.98)
    """Fraction of each GPU's memory vLLM may use."""
    max_num_seqs: int = Field(default=16, gt=0, le=4096)
    """Concurrent sequences."""
    max_num_batched_tokens: int = Field(default=8192, gt=0, le=1_048_576)
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
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    """Extra environment variables for vLLM. Variables the launcher sets from validated
    fields are refused here (set the field instead)."""
    extra_vllm_args: list[str] = Field(default_factory=list, max_length=256)
    """Flags appended verbatim to ``vllm serve`` (escape hatch). Flags the launcher renders
    from validated fields are refused here (set the field instead)."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                "use letters, digits, '.', '_' and '-' (up to 64, starting with a letter or "
                "digit), like the file name"
            )
        return value

    @field_validator("served_model_name")
    @classmethod
    def _safe_served_name(cls, value: str) -> str:
        if not _MODEL_NAME.fullmatch(value):
            raise ValueError("use letters, digits and . _ / : - (up to 128), no spaces")
        return value

    @field_validator("model")
    @classmethod
    def _model_ref(cls, value: str) -> str:
        if not value.strip() or len(value) > 1024 or _CONTROL.search(value):
            raise ValueError(
                "give a Hugging Face repository id or a path (non-empty, one line, up to 1024)"
            )
        return value

    @field_validator("description")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if len(value) > 500 or _CONTROL.search(value):
            raise ValueError("one line of up to 500 characters")
        return value

    @field_validator("host")
    @classmethod
    def _host_address(cls, value: str) -> str:
        import ipaddress

        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not _HOSTNAME.fullmatch(value):
                raise ValueError("an IP address (127.0.0.1, 0.0.0.0, ::1) or a host name") from None
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(
                    f"env key {key[:40]!r}: a variable name is letters, digits and '_', not "
                    "starting with a digit"
                )
            if "\x00" in val or len(val) > 4096:
                raise ValueError(f"env.{key}: the value has a NUL byte or exceeds 4096 chars")
        return value

    @field_validator("extra_vllm_args")
    @classmethod
    def _args_text(cls, value: list[str]) -> list[str]:
        for arg in value:
            if "\x00" in arg or len(arg) > 4096:
                raise ValueError(f"{arg[:40]!r}: has a NUL byte or exceeds 4096 characters")
        return value
