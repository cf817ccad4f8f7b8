"""The pipeline relay: DeepSeek-V4.1's model with layer-source caches carried across stages.

``PipelineRelayDeepseekV4Model`` is vLLM 0.33.0's ``DeepseekV4Model`` plus, when a
pipeline cut falls inside a sharing group:

- before the decoder layers are built, same-name mirrors of every earlier-stage source
  this stage (or a later one) reads (``mirror.py``), so construction succeeds and vLLM
  plans, allocates and binds the mirrors' pages with the owner's block ids;
- ``make_empty_intermediate_tensors`` declares the relay keys this stage receives
  (fixed width, token-indexed, so the runner's persistent buffers and FULL CUDA graphs
  cover them);
- ``forward``: a receiving stage installs the records at entry (scatter into the
  mirror at this step's slots; candidate and Top-K rows into its buffers), and a
  sending stage appends them after vLLM's own forward (gathered from the real cache
  or from its own mirror: multi-hop forwarding is the same code).

Inert (exactly vLLM's class) at PP=1, for cuts that cross nothing, and while the relay
is not enabled (``model_topology.plugin_capabilities``: off by default until it has run on
GPUs, on with ``DEEPINFER_PP_RELAY=1``).

``PipelineRelayDeepseekV41LLMForCausalLM`` only swaps ``model_cls``: vLLM binds the
model class there at class creation, so the ledger rebinds the LLM class where the
multimodal wrapper looks it up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import torch
from vllm.distributed.utils import get_pp_indices
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.models.deepseek_v41.nvidia import model as v41
from vllm.sequence import IntermediateTensors
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadata

from deepinfer_sm80 import model_topology
from deepinfer_sm80.vllm_plugin.pp_relay import records
from deepinfer_sm80.vllm_plugin.pp_relay.mirror import (
    CompressedKVMirror,
    compressed_record_bytes,
    index_k_record_bytes,
    make_index_k_mirror,
)

ENABLE_ENV = model_topology.RELAY_OPT_IN_ENV


def relay_enabled(env=os.environ) -> bool:
    """The same rule the launcher validated the partition with."""
    return model_topology.plugin_capabilities(env).relays_shared_kv


def stage_partition(num_layers: int, pp_size: int) -> list[int]:
    """Layers per stage as vLLM splits them (``VLLM_PP_LAYER_PARTITION`` or even)."""
    sizes = []
    for rank in range(pp_size):
        start, end = get_pp_indices(num_layers, rank, pp_size)
        sizes.append(end - start)
    return sizes


@dataclass
class StageRelay:
    """What one pipeline stage receives, forwards and sends."""

    layers_prefix: str
    start: int
    end: int
    receives: list[model_topology.RelayItem]
    sends: list[model_topology.RelayItem]
    mirrors: dict[str, torch.nn.Module] = field(default_factory=dict)
    widths: dict[str, int] = field(default_factory=dict)  # record bytes per kind

    def layer_name(self, item: model_topology.RelayItem) -> str:
        attn = f"{self.layers_prefix}.{item.source}.attn"
        return f"{attn}.indexer.k_cache" if item.kind == "index_k" else attn


def plan_stage(vllm_config, layers_prefix: str) -> StageRelay | None:
    """This rank's relay, or None when nothing crosses its boundaries."""
    config = vllm_config.model_config.hf_config
    pp = v41.get_pp_group()
    if pp.world_size < 2:
        return None
    num_layers = config.num_hidden_layers
    partition = stage_partition(num_layers, pp.world_size)
    plan = model_topology.relay_plan(
        partition,
        compress_ratios=tuple(config.compress_ratios[:num_layers]),
        kv_sources=tuple(config.kv_source_layer_ids or ()),
        index_sources=tuple(config.index_source_layer_ids or ()),
        candidate_source=getattr(config, "candidate_source_layer_id", -1),
    )
    start, end = get_pp_indices(num_layers, pp.rank_in_group, pp.world_size)
    receives = plan.get(start, []) if start > 0 else []
    sends = plan.get(end, []) if end < num_layers else []
    if not receives and not sends:
        return None
    return StageRelay(layers_prefix, start, end, list(receives), list(sends))


def register_mirrors(stage: StageRelay, vllm_config) -> None:
    """Mirrors of every earlier-stage source this stage receives (before make_layers)."""
    ratios = vllm_config.model_config.hf_config.compress_ratios
    for item in stage.receives:
        if item.kind == "kv":
            name = stage.layer_name(item)
            stage.mirrors[name] = CompressedKVMirror(
                name, item.source, int(ratios[item.source]), vllm_config
            )
        elif item.kind == "index_k":
            name = stage.layer_name(item)
            stage.mirrors[name] = make_index_k_mirror(name, int(ratios[item.source]), vllm_config)


def candidate_row_map(attn_metadata: dict, index_k_name: str, rows: int):
    """The consumer-view row map of the candidate buffer for this step (``None`` =
    identity), from the indexer metadata the source writes with and the consumers
    read with: the source's index-K name where this rank has it (owner or mirror),
    else any indexer's (the decode layout is a property of the batch)."""
    meta = attn_metadata.get(index_k_name)
    if not isinstance(meta, DeepseekV32IndexerMetadata):
        indexers = (m for m in attn_metadata.values() if isinstance(m, DeepseekV32IndexerMetadata))
        meta = next(indexers, None)
    if meta is None or meta.decode is None or meta.num_decodes == 0:
        return None
    num_decode_tokens = int(meta.num_decode_tokens)
    lens = meta.decode.decode_lens
    # vLLM's needs_padded_path, evaluated the same way (host values only).
    padded = bool(meta.decode.requires_padding) or num_decode_tokens % lens.shape[0] != 0
    return records.candidate_rows(rows, num_decode_tokens, lens, padded)


def _local_attentions(model) -> list[Any]:
    return [
        layer.attn
        for layer in islice(model.layers, model.start_layer, model.end_layer)
        if isinstance(layer, v41.DeepseekV4DecoderLayer)
    ]


class PipelineRelayDeepseekV4Model(v41.DeepseekV4Model):
    """vLLM's DeepSeek-V4.1 model with the pipeline relay (inert unless a cut needs it)."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        stage = plan_stage(vllm_config, f"{prefix}.layers") if relay_enabled() else None
        if stage is not None:
            register_mirrors(stage, vllm_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._pp_relay = stage
        if stage is None:
            return
        # DSpark over PP (design P4): the draft's aux hidden states are captured
        # locally, which holds while every aux layer sits on the last stage after its
        # first layer (checked in _set_aux_hidden_state_layers).
        self.supports_aux_hidden_states_over_pp = True
        attentions = _local_attentions(self)
        if not attentions:
            raise RuntimeError("pipeline relay: this stage holds no decoder layer")
        for name, mirror in stage.mirrors.items():
            if isinstance(mirror, CompressedKVMirror):
                readers = [a for a in attentions if a.compressed_cache_prefix == name]
                mirror.set_consumer(readers[0] if readers else attentions[0])
        config = vllm_config.model_config.hf_config
        stage.widths = {
            "kv": compressed_record_bytes(attentions[0]),
            "index_k": index_k_record_bytes(vllm_config),
            "candidates": int(getattr(config, "candidate_topk_blocks", 0)),
            "topk": int(config.index_topk),
        }

    # -- payload ---------------------------------------------------------------------
    def _item_tensor(self, item, rows: int, device) -> torch.Tensor:
        width = self._pp_relay.widths[item.kind]
        dtype = torch.int32 if item.kind in ("candidates", "topk") else torch.uint8
        return torch.zeros((rows, width), dtype=dtype, device=device)

    def make_empty_intermediate_tensors(self, batch_size, dtype, device):
        tensors = super().make_empty_intermediate_tensors(batch_size, dtype, device)
        stage = self._pp_relay
        if stage is not None:
            for item in stage.receives:
                tensors[item.key] = self._item_tensor(item, batch_size, device)
        return tensors

    def _cache_and_slots(self, item, attn_metadata):
        stage = self._pp_relay
        name = stage.layer_name(item)
        cache = self.vllm_config.compilation_config.static_forward_context[name].kv_cache
        if cache.dtype != torch.uint8:
            cache = cache.view(torch.uint8)
        return cache, attn_metadata[name].slot_mapping

    def _buffer(self, item) -> torch.Tensor:
        if item.kind == "candidates":
            return self.candidate_block_buffer
        return self.topk_indices_buffer

    def _row_map(self, item, attn_metadata, rows: int):
        """Candidate rows travel in the consumer view; Top-K rows are
        token-indexed once the indexer has unpacked them, so rows ``[0, n)`` are exact."""
        if item.kind != "candidates":
            return None
        index_k = f"{self._pp_relay.layers_prefix}.{item.source}.attn.indexer.k_cache"
        return candidate_row_map(attn_metadata, index_k, rows)

    def install_relay(self, intermediate_tensors: IntermediateTensors, attn_metadata) -> None:
        """Receiving stage, before its first layer: write the records into the mirrors
        and the rows into this rank's candidate / Top-K buffers."""
        for item in self._pp_relay.receives:
            payload = intermediate_tensors[item.key]
            if item.kind in ("kv", "index_k"):
                cache, slots = self._cache_and_slots(item, attn_metadata)
                records.unpack_records(payload, slots[: payload.shape[0]], cache)
            else:
                records.unpack_rows(
                    payload,
                    self._buffer(item),
                    self._row_map(item, attn_metadata, payload.shape[0]),
                )

    def pack_relay(self, output: IntermediateTensors, attn_metadata) -> None:
        """Sending stage, after its last layer: add what the next stage receives."""
        rows = output["hidden_states"].shape[0]
        device = output["hidden_states"].device
        for item in self._pp_relay.sends:
            out = self._item_tensor(item, rows, device)
            if not isinstance(attn_metadata, dict):
                pass  # profile run: caches unbound, zeros keep the keys present
            elif item.kind in ("kv", "index_k"):
                cache, slots = self._cache_and_slots(item, attn_metadata)
                records.pack_records(cache, slots[:rows], out)
            else:
                records.pack_rows(self._buffer(item), out, self._row_map(item, attn_metadata, rows))
            output[item.key] = out

    def forward(
        self,
        input_ids,
        positions,
        intermediate_tensors,
        inputs_embeds=None,
        lookback_token_ids=None,
        decode_step=None,
    ):
        args = (
            input_ids,
            positions,
            intermediate_tensors,
            inputs_embeds,
            lookback_token_ids,
            decode_step,
        )
        stage = self._pp_relay
        if stage is None:
            return super().forward(*args)
        attn_metadata = (
            get_forward_context().attn_metadata if is_forward_context_available() else None
        )
        if isinstance(attn_metadata, list):
            raise NotImplementedError(
                "pipeline relay: micro-batching (DBO/ubatch) is not supported; turn it off"
            )
        if stage.receives and isinstance(attn_metadata, dict):
            self.install_relay(intermediate_tensors, attn_metadata)
        output = super().forward(*args)
        if stage.sends and isinstance(output, IntermediateTensors):
            self.pack_relay(output, attn_metadata)
        return output

    # -- DSpark over PP --------------------------------------------------------------
    def _set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        stage = self._pp_relay
        pp = v41.get_pp_group()
        if stage is not None and pp.world_size > 1:
            num_layers = self.config.num_hidden_layers
            last_start = get_pp_indices(num_layers, pp.world_size - 1, pp.world_size)[0]
            bad = [layer for layer in layers if not last_start < layer <= num_layers]
            if bad:
                raise ValueError(
                    f"pipeline relay: DSpark aux hidden-state layers {bad} are not on the "
                    f"last stage after its first layer ({last_start}); DeepSeek-V4.1 "
                    "captures them only there. Move the cut so that every aux layer "
                    f"({sorted(layers)}) is > the last stage's first layer"
                )
        super()._set_aux_hidden_state_layers(layers)


class PipelineRelayDeepseekV41LLMForCausalLM(v41.DeepseekV41LLMForCausalLM):
    """vLLM's text model class, building the relay model."""

    model_cls = PipelineRelayDeepseekV4Model
