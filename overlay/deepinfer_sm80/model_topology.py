"""DeepSeek-V4.1's shape constants, its layer-sharing groups and the pipeline cuts they allow.

Pure Python (no torch, no vLLM): the launcher, validator and planner (``deploy/``) and the
vLLM plugin read the model's constants and the cut rule from here, together with the
capabilities the plugin declares, so ``deepinfer launch`` accepts exactly the partitions
the plugin can serve. ``configs/model/deepseek-v4.1-flash.yaml`` lists the same facts
with their sources (and the sizes the planner derives weights from);
``tests/deploy/test_model_facts.py`` keeps the two equal.

Facts (vLLM 0.33.0, ``vllm/models/deepseek_v41/attention.py:322-360, 448-613``; HF
config of DeepSeek-V4.1-Flash): 40 decoder layers. Layers 0-1 are SWA-only. Layers
2-39 read a compressed KV cache and an indexer-K cache owned by their group's source
(kv sources 2, 8, 14, 20; layers 20-39 all read layer 20, "YOCO"). Index sources 2, 8,
14, 20, 24, 28, 32, 36 compute the Top-K rows their following layers use; 24/28/32/36
re-score inside layer 20's candidate blocks. A layer whose group source sits on an
earlier pipeline stage finds no cache at model construction: stock vLLM raises
``NotImplementedError`` ("PP splits inside a v4.1 kv-sharing group").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

from deepinfer_sm80 import envs

NUM_LAYERS = 40  # num_hidden_layers (decoder layers; the DSpark draft layers come after)
NUM_ATTENTION_HEADS = 64  # num_attention_heads
HIDDEN_SIZE = 5120  # hidden_size
HC_MULT = 4  # hidden-state copies the mHC boundary carries (hc_mult)
HEAD_DIM = 512  # head_dim: the one latent KV head, 448 NoPE + 64 RoPE dims
MOE_INTERMEDIATE_SIZE = 2304  # moe_intermediate_size (routed and shared experts)
ENGRAM_LAYERS = (1, 14)  # engram_layer_ids: one Engram table each
KV_SOURCES = (2, 8, 14, 20)
INDEX_SOURCES = (2, 8, 14, 20, 24, 28, 32, 36)
CANDIDATE_SOURCE = 20
# Per decoder layer: 0 = sliding window only, 1 = full-length compressed, 2 = ratio 2.
COMPRESS_RATIOS = (0, 0) + (2,) * 18 + (1,) * 20
# Bytes per token of what the pipeline relay carries (vLLM 0.33.0 off SM100, as on
# Ampere): the V4 compressed-KV record (--kv-cache-dtype fp8 -> fp8_ds_mla), the fp8
# index-K entry, a candidate-block row (2048 int32) and a Top-K row (512 int32).
RELAY_RECORD_BYTES = {"kv": 584, "index_k": 132, "candidates": 2048 * 4, "topk": 512 * 4}
# What every stage boundary already carries: hidden_states [hc=4, 5120] bf16 + pre_mix
# [4] fp32.
BASELINE_PP_BYTES_PER_TOKEN = HC_MULT * HIDDEN_SIZE * 2 + HC_MULT * 4


@dataclass(frozen=True)
class SharingGroup:
    """Layers ``first..last`` read the compressed KV and indexer-K caches of ``source``."""

    source: int
    first: int
    last: int

    def __contains__(self, layer: int) -> bool:
        return self.first <= layer <= self.last

    def __str__(self) -> str:
        return f"layers {self.first}-{self.last} (caches owned by layer {self.source})"


SHARING_GROUPS = (
    SharingGroup(2, 2, 7),
    SharingGroup(8, 8, 13),
    SharingGroup(14, 14, 19),
    SharingGroup(20, 20, 39),
)


@dataclass(frozen=True)
class PluginCapabilities:
    """What the overlay's vLLM plugin can do about cross-stage sharing.

    ``relays_shared_kv``: layer-source caches (compressed KV, indexer K) and candidate
    rows are mirrored and relayed to later stages (the pipeline relay,
    ``vllm_plugin/pp_relay``). It is built and tested on CPU against vLLM 0.33.0 but has
    not run on GPUs, so it is off by default and opt-in (``RELAY_OPT_IN_ENV``).
    """

    relays_shared_kv: bool = False


# What the plugin does by default. The relay turns on by default once the end-to-end
# check on GPUs (vllm_plugin/pp_relay/README.md) has passed.
PLUGIN_CAPABILITIES = PluginCapabilities(relays_shared_kv=False)
# Set to 1 to use the pipeline relay before then: the launcher accepts cuts inside
# sharing groups (with a warning) and the plugin in every worker builds the relay.
RELAY_OPT_IN_ENV = "DEEPINFER_PP_RELAY"


def plugin_capabilities(env: Mapping[str, str] = os.environ) -> PluginCapabilities:
    """The capabilities in force here: the defaults, plus the relay when opted in."""
    opted_in = envs.flag(RELAY_OPT_IN_ENV, env)
    return PluginCapabilities(relays_shared_kv=PLUGIN_CAPABILITIES.relays_shared_kv or opted_in)


def cuts_phrase(cuts) -> str:
    """'the cut at layer 28' / 'the cuts at layers 7, 21'."""
    cuts = [str(c) for c in cuts]
    return (
        f"the cut at layer {cuts[0]}" if len(cuts) == 1 else f"the cuts at layers {', '.join(cuts)}"
    )


def relay_unproven(capabilities: PluginCapabilities) -> bool:
    """True when the relay is in use but is no default (it has not run across pipeline
    stages on GPUs)."""
    return capabilities.relays_shared_kv and not PLUGIN_CAPABILITIES.relays_shared_kv


@dataclass(frozen=True)
class CrossStage:
    """One thing a pipeline cut makes cross-stage: produced before ``cut``, read after."""

    cut: int
    group: SharingGroup
    objects: tuple[str, ...]


def stage_layers(partition: list[int] | tuple[int, ...]) -> list[range]:
    """Layer ranges per stage for a ``VLLM_PP_LAYER_PARTITION``-style partition."""
    ranges, start = [], 0
    for n in partition:
        ranges.append(range(start, start + n))
        start += n
    return ranges


def cut_points(partition: list[int] | tuple[int, ...]) -> list[int]:
    """First layer of every stage after the first."""
    return [r.start for r in stage_layers(partition)[1:]]


def legal_cut_points(capabilities: PluginCapabilities = PLUGIN_CAPABILITIES) -> list[int]:
    """Layers a stage may start at: outside every group's interior, unless relayed."""
    if capabilities.relays_shared_kv:
        return list(range(1, NUM_LAYERS))
    return [
        c for c in range(1, NUM_LAYERS) if not any(g.first < c <= g.last for g in SHARING_GROUPS)
    ]


def cross_stage(partition: list[int] | tuple[int, ...]) -> list[CrossStage]:
    """What each cut inside a sharing group makes cross-stage."""
    found = []
    for cut in cut_points(partition):
        for group in SHARING_GROUPS:
            if not group.first < cut <= group.last:
                continue
            objects = ["compressed KV cache", "indexer-K cache"]
            if group.source == CANDIDATE_SOURCE and any(cut <= s for s in INDEX_SOURCES if s > 20):
                objects.append("candidate rows")
            # Top-K rows cross when the cut separates an index source from its consumers
            # (the layers up to the next index source).
            if cut not in INDEX_SOURCES:
                objects.append("Top-K rows")
            found.append(CrossStage(cut, group, tuple(objects)))
    return found


def partition_errors(
    partition: list[int] | tuple[int, ...],
    capabilities: PluginCapabilities = PLUGIN_CAPABILITIES,
) -> list[str]:
    """Why ``partition`` cannot be served (empty when it can), one sentence each."""
    errors = []
    if any((not isinstance(n, int)) or n < 1 for n in partition):
        return [f"every stage needs at least one layer, got {list(partition)}"]
    if sum(partition) != NUM_LAYERS:
        return [f"the stages hold {sum(partition)} layers; DeepSeek-V4.1 has {NUM_LAYERS}"]
    if capabilities.relays_shared_kv:
        return errors
    legal = legal_cut_points(capabilities)
    for item in cross_stage(partition):
        errors.append(
            f"the cut at layer {item.cut} splits the sharing group {item.group}: "
            f"{', '.join(item.objects)} would have to cross stages, which vLLM 0.33.0 "
            f"cannot do. The overlay's pipeline relay carries them but has not run across "
            f"pipeline stages on GPUs: set {RELAY_OPT_IN_ENV}=1 to use it, or start stages only at "
            f"layers {', '.join(map(str, legal))}"
        )
    return errors


def legal_partitions(stages: int, capabilities: PluginCapabilities = PLUGIN_CAPABILITIES):
    """Every partition into ``stages`` stages that ``partition_errors`` accepts."""
    cuts = legal_cut_points(capabilities)
    out = []

    def walk(start: int, left: int, acc: list[int]) -> None:
        if left == 1:
            out.append((*acc, NUM_LAYERS - start))
            return
        for c in cuts:
            if c > start and NUM_LAYERS - c >= left - 1:
                walk(c, left - 1, [*acc, c - start])

    if stages == 1:
        return [(NUM_LAYERS,)]
    walk(0, stages, [])
    return out


def most_even_partition(
    stages: int, capabilities: PluginCapabilities = PLUGIN_CAPABILITIES
) -> tuple[int, ...] | None:
    """The legal partition with the fewest layers on its largest stage (ties: the
    lexicographically smallest), without listing partitions: their number grows
    combinatorially with the stages once the relay makes every cut legal. None when no
    legal partition has ``stages`` stages."""
    if not 1 <= stages <= NUM_LAYERS:
        return None
    starts = set(legal_cut_points(capabilities))

    def fits(largest: int) -> tuple[int, ...] | None:
        @cache
        def can(pos: int, left: int) -> bool:  # layers pos.. in `left` stages, each <= largest
            if left == 1:
                return NUM_LAYERS - pos <= largest
            return any(
                can(c, left - 1)
                for c in range(pos + 1, min(pos + largest, NUM_LAYERS) + 1)
                if c in starts
            )

        if not can(0, stages):
            return None
        out, pos = [], 0
        for left in range(stages, 1, -1):  # greedy: the smallest stage that still fits
            nxt = next(
                c for c in range(pos + 1, pos + largest + 1) if c in starts and can(c, left - 1)
            )
            out.append(nxt - pos)
            pos = nxt
        return (*out, NUM_LAYERS - pos)

    for largest in range(-(-NUM_LAYERS // stages), NUM_LAYERS + 1):
        best = fits(largest)
        if best is not None:
            return best
    return None


@dataclass(frozen=True)
class RelayItem:
    """One thing the stage before ``cut`` hands to the stage starting at ``cut``.

    ``kind``: "kv" (compressed-KV records of ``source``), "index_k" (its index-K
    entries), "candidates" (candidate-block rows of the candidate source) or "topk"
    (the Top-K rows the last index source before ``cut`` left for the layers after it).
    """

    cut: int
    kind: str
    source: int

    @property
    def key(self) -> str:
        """The IntermediateTensors key the relay uses for it."""
        return f"__dsv41pp.{self.kind}.{self.source}"


def relay_plan(
    partition: list[int] | tuple[int, ...],
    *,
    compress_ratios: tuple[int, ...] = COMPRESS_RATIOS,
    kv_sources: tuple[int, ...] = KV_SOURCES,
    index_sources: tuple[int, ...] = INDEX_SOURCES,
    candidate_source: int = CANDIDATE_SOURCE,
) -> dict[int, list[RelayItem]]:
    """For every cut, what the pipeline relay must carry across it (empty when nothing).

    A stage needs a source's caches when one of its layers reads them and the source
    sits on an earlier stage. Every stage between the source and the last stage that
    needs it keeps a mirror and forwards the records (multi-hop), so each boundary
    carries what any later stage needs from before it. Top-K rows only cross into a
    stage whose first layer reads an earlier index source's selection.
    """
    ranges = stage_layers(partition)
    num_layers = ranges[-1].stop if ranges else 0

    def ratio(layer: int) -> int:
        return compress_ratios[layer] if layer < len(compress_ratios) else 0

    def last_at_or_below(sources, layer):
        below = [s for s in sources if s <= layer]
        return max(below) if below else None

    needs: list[set[tuple[str, int]]] = []
    for r in ranges:
        need: set[tuple[str, int]] = set()
        for layer in r:
            if ratio(layer) == 0:
                continue
            kv = last_at_or_below(kv_sources, layer)
            if kv is not None and kv < r.start:
                need.add(("kv", kv))
            is_index = layer in index_sources
            if is_index and layer not in kv_sources and kv is not None and kv < r.start:
                need.add(("index_k", kv))
            if is_index and 0 <= candidate_source < layer and candidate_source < r.start:
                need.add(("candidates", candidate_source))
        first = r.start
        index = last_at_or_below(index_sources, first)
        if ratio(first) > 0 and first not in index_sources and index is not None:
            need.add(("topk", index))
        needs.append(need)
    plan: dict[int, list[RelayItem]] = {}
    for i, r in enumerate(ranges[1:], start=1):
        carried: set[tuple[str, int]] = set()
        for later in needs[i:]:
            carried |= {(k, s) for k, s in later if s < r.start and k != "topk"}
        carried |= {(k, s) for k, s in needs[i] if k == "topk"}
        plan[r.start] = [RelayItem(r.start, k, s) for k, s in sorted(carried, key=_item_order)]
    assert all(cut < num_layers for cut in plan)
    return plan


def _item_order(item: tuple[str, int]) -> tuple[int, int]:
    return (["kv", "index_k", "candidates", "topk"].index(item[0]), item[1])


def relay_bytes_per_token(
    partition: list[int] | tuple[int, ...], record_bytes: dict[str, int] | None = None
) -> dict[int, int]:
    """Extra bytes per token the relay adds at each cut (0 where nothing crosses)."""
    widths = record_bytes or RELAY_RECORD_BYTES
    return {
        cut: sum(widths[item.kind] for item in items)
        for cut, items in relay_plan(partition).items()
    }
