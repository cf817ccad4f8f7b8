"""DeepSeek-V4.1's layer-sharing groups and the pipeline cuts they allow.

Pure Python (no torch, no vLLM): the launcher and planner (``deploy/``) and the vLLM
plugin read the same rule from here, together with the capabilities the plugin
declares, so ``deepinfer launch`` accepts exactly the partitions the plugin can serve.

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

from dataclasses import dataclass

NUM_LAYERS = 40
KV_SOURCES = (2, 8, 14, 20)
INDEX_SOURCES = (2, 8, 14, 20, 24, 28, 32, 36)
CANDIDATE_SOURCE = 20


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
    rows are mirrored and relayed to later stages (the pipeline relay). Not built yet:
    until it is, a cut inside a sharing group is refused before launch.
    """

    relays_shared_kv: bool = False


PLUGIN_CAPABILITIES = PluginCapabilities(relays_shared_kv=False)


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
            f"cannot do and the overlay's pipeline relay does not yet provide. Legal "
            f"stage starts: {', '.join(map(str, legal))}"
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
