"""Where the shipped configuration lives, the error a bad config file raises, and the model
facts files (every number the validator and the planner read from them, checked).

The lowest layer of ``deploy``: the topology validator and the planner both read it, and
it reads neither.
"""

from __future__ import annotations

from pathlib import Path

from deepinfer_sm80 import envs
from deepinfer_sm80.deploy import safe_yaml

# configs/ beside overlay/ (envs.py says where), unless DEEPINFER_CONFIG_DIR points elsewhere.
CONFIG_DIR = Path(envs.get("DEEPINFER_CONFIG_DIR"))
TOPOLOGY_DIR = CONFIG_DIR / "topologies"


class ConfigError(Exception):
    """A topology file that cannot be used; the message is meant for the user as-is."""


def shown(value) -> str:
    """The offending value, short enough for one line."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


MODEL_FACTS_FILE = CONFIG_DIR / "model" / "deepseek-v4.1-flash.yaml"
# The smoke checkpoint's sizes where they differ from the real model's.
SMOKE_FACTS_FILE = CONFIG_DIR / "model" / "deepseek-v4.1-smoke.yaml"
# Every number the validator and the planner read from the model facts (dotted paths).
MODEL_FACT_NUMBERS = (
    "num_hidden_layers", "num_attention_heads", "max_position_embeddings", "dspark_layers",
    "hidden_size", "vocab_size", "n_shared_experts", "attention_params_per_layer",
    "moe.n_routed_experts", "moe.moe_intermediate_size", "dspark_moe.n_routed_experts",
    "bytes_per_param.bf16", "bytes_per_param.mxfp8", "bytes_per_param.mxfp4",
    "checkpoint_gib_reported.engram", "checkpoint_gib_reported.backbone",
    "kv_bytes_per_token.v4_record",
    "kv_bytes_per_token.indexer_k_fp8",
)  # fmt: skip


def model_facts(checkpoint: str = "full") -> dict:
    """The model facts of ``checkpoint`` (the schema's ``checkpoint`` field), with every
    number the tools use checked (ConfigError): ``full`` is the real model's file;
    ``smoke`` overlays the smoke checkpoint's sizes on it."""
    if checkpoint not in ("full", "smoke"):
        raise ValueError(f"checkpoint: {checkpoint!r} is neither full nor smoke")
    path = MODEL_FACTS_FILE
    try:
        facts = safe_yaml.load(path)
    except ValueError as exc:
        raise ConfigError(f"model facts: {exc}") from None
    if not isinstance(facts, dict):
        raise ConfigError(f"{path}: expected a mapping of model facts")
    for dotted in MODEL_FACT_NUMBERS:
        value = facts
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(
                f"{path}: {dotted}: expected a positive number, got {shown(value)}; restore "
                "it from the model's config.json (the file's comments name the source)"
            )
    if checkpoint == "smoke":
        smoke = safe_yaml.load(SMOKE_FACTS_FILE)
        unknown = set(smoke) - set(facts)
        if unknown:
            raise ValueError(f"{SMOKE_FACTS_FILE.name}: unknown facts {sorted(unknown)}")
        facts.update(smoke)
    return facts
