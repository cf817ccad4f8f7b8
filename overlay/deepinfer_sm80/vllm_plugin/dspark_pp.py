"""DSpark over pipeline parallelism: the draft loads its own input embedding.

DSpark's draft lives on the last pipeline stage and normally borrows the target's
``embed_tokens``. With PP > 1 that embedding lives on stage 0 only (a ``PPMissingLayer``
on the last stage), so vLLM 0.33.0 stops at draft load with "needs the target input
embedding, but it is unavailable on this PP stage" -- for every PP topology with DSpark,
``tp4-pp2`` included (shared/docs/pp-relay-design.md, blocker B / P5).

Ours is vLLM's draft class that, under PP > 1, declares its own embedding and loads the
checkpoint's ``embed.weight`` into it through the parameter's ``weight_loader`` (the
vocab-parallel loader: this rank's TP shard plus padding). It fails loudly when the
checkpoint has no ``embed.weight``. Cost: 129,280 x 5,120 bf16 / TP = 1.32 GB / TP on the
last stage. At PP = 1 nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from vllm.distributed import get_pp_group
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.models.deepseek_v41.nvidia.dspark import (
    DSparkDeepseekV4ForCausalLM as _VllmDSpark,
)

EMBED_NAME = "embed.weight"  # the target's input embedding in the checkpoint


def load_with_own_embedding(
    embed_param: torch.nn.Parameter,
    weights: Iterable[tuple[str, torch.Tensor]],
    load_rest: Callable[[Iterable[tuple[str, torch.Tensor]]], set[str]],
    param_name: str = "model.embed_tokens.weight",
) -> set[str]:
    """Stream ``weights`` to ``load_rest`` while loading ``embed.weight`` into
    ``embed_param``; raise if the checkpoint never provided it."""
    found = []

    def rest() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if name == EMBED_NAME:
                loader = getattr(embed_param, "weight_loader", default_weight_loader)
                loader(embed_param, tensor)
                found.append(name)
                continue
            yield name, tensor

    loaded = set(load_rest(rest()))
    if not found:
        raise RuntimeError(
            f"DSpark over pipeline parallelism needs the draft's own input embedding, but "
            f"the checkpoint has no {EMBED_NAME!r}; check the model path, or run DSpark "
            "with pipeline_parallel 1"
        )
    return loaded | {param_name}


class DSparkPPDeepseekV4ForCausalLM(_VllmDSpark):
    """vLLM's DeepSeek-V4.1 DSpark draft; under PP > 1 it owns its input embedding."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # An instance attribute: vLLM's maybe_share_target_embed reads it after load.
        self.has_own_embed_tokens = get_pp_group().world_size > 1

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if not self.has_own_embed_tokens:
            return super().load_weights(weights)
        return load_with_own_embedding(
            self.model.embed_tokens.weight, weights, super().load_weights
        )
