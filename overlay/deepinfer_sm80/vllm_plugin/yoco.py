"""YOCO reuse: per-step index metadata built once per sharing group, not once per layer.

DeepSeek-V4.1's layers share their Top-K rows and compressed cache in groups
(``model_topology.SHARING_GROUPS``; vLLM 0.33.0 ``deepseek_v41/attention.py``): an
*index source* (layers 2, 8, 14, 20, 24, 28, 32, 36) writes the shared
``topk_indices_buffer`` just before its own attention, and every later layer up to the
next index source reads the same rows, against the same compressed block table (that of
its *kv source*: 2, 8, 14, 20). vLLM's FlashMLA layer rebuilds, in every one of them,
things that are equal across such a run of layers within one forward pass:

- decode: the Top-K slot conversion ``compute_global_topk_indices_and_lens``
  (Top-K rows, ``token_to_req_indices``, ``is_valid_token``, the kv source's block
  table and page size);
- prefill: the chunk plan ``get_prefill_chunk_plan`` (SWA metadata and compress ratio
  only: equal for every layer of one ratio) and, per chunk, the combined index rows of
  ``combine_topk_swa_indices`` (Top-K rows, SWA prefill metadata, window, ratio, plan).

``StepMemo`` keeps one entry per kind (decode slots, plan, one per prefill chunk) and
hands it back to a later layer only when all of these hold:

1. the same forward pass: the current vLLM ``ForwardContext`` object (a new one per
   ``set_forward_context``: every step, draft pass, decoder replay and graph capture)
   is the one the entry was built under; a new one drops every entry (explicit
   invalidation);
2. the same inputs: the key (plain values: index source, ratio, sizes, chunk bounds)
   is equal and every anchor (the metadata objects and tensors read) is the *same
   object*; the memo holds them, so their ids cannot be recycled while it does;
3. the Top-K rows were not rewritten since: an index-source layer never reads an entry
   that depends on them (its indexer has just rewritten them), it rebuilds and replaces
   it;
4. the same pass, in layer order: the layer's id is above that of every layer that
   used the entry. Within one pass vLLM runs layers in ascending order, so a lower or
   equal id means a new pass with reused objects (a draft pass re-running layers on
   metadata updated in place, a capture's warm-up and capture runs); the entry is
   rebuilt then.

Without a forward context (direct calls, vLLM's dummy/profile run) or with
``DEEPINFER_YOCO=0`` nothing is memoized: every layer builds, as vLLM does.

Not reused (why): the gathered compressed history in the prefill workspace. vLLM's
workspace is one buffer handed to other ops between attention layers (the MoE modular
kernel of every layer, ``fused_moe/modular_kernel.py``; the prefill indexer of index
sources, ``sparse_attn_indexer.py``), and the manager has no generation counter to tell
whether it was handed out since. A buffer of our own would have to hold
``PREFILL_CHUNK_SIZE x (ceil(max_model_len / ratio) + window + max_num_batched_tokens)``
bf16 rows of 512 (the size of the whole prefill reservation, ~4.3 GB at 1M context)
outside vLLM's memory profiling, to save one gather per layer. See the attention layer.

CUDA graphs: under FULL capture the Python runs once and the captured kernels keep the
data flow of that run (the index source's conversion output read by its consumers in
the same graph); under piecewise/breakable graphs the attention runs eagerly at replay,
under that replay's own forward context.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from vllm.forward_context import get_forward_context, is_forward_context_available

from deepinfer_sm80 import envs

T = TypeVar("T")

ENV_VAR = "DEEPINFER_YOCO"

DECODE_TOPK = "decode_topk"
PREFILL_PLAN = "prefill_plan"
PREFILL_INDICES = "prefill_indices"


def enabled() -> bool:
    """The switch (read at every call, so an A/B needs no restart of Python):
    ``DEEPINFER_YOCO=0`` turns reuse off; anything else, or unset, leaves it on."""
    return envs.flag(ENV_VAR)


@dataclasses.dataclass(frozen=True)
class LayerRole:
    """Where a layer sits in the sharing topology (vLLM's own attributes)."""

    layer_id: int
    index_source: int | None  # None: SWA-only layer (reads no Top-K rows)
    writes_topk: bool  # an index source: its indexer rewrites the rows before its attention

    @classmethod
    def of(cls, layer: Any) -> LayerRole | None:
        """None when the layer lacks vLLM's topology attributes (then: no reuse)."""
        layer_id = getattr(layer, "layer_id", None)
        if not isinstance(layer_id, int):
            return None
        if getattr(layer, "compress_ratio", 0) == 0:
            return cls(layer_id, None, False)
        index_source = getattr(layer, "index_source_layer_id", None)
        if not isinstance(index_source, int):
            return None
        writes = bool(getattr(layer, "is_index_source", False)) or index_source == layer_id
        return cls(layer_id, index_source, writes)


@dataclasses.dataclass
class _Entry:
    key: tuple[Hashable, ...]
    anchors: tuple[object, ...]
    value: Any
    last_layer: int


def _same_objects(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    # Identity only: tensors compare element-wise under ==.
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class StepMemo:
    """One forward pass's reusable metadata; see the module docstring for the rules.

    ``builds`` / ``reuses`` count per kind, ``invalidations`` counts dropped passes:
    tests and the serving A/B read them."""

    def __init__(self) -> None:
        self._step: object | None = None
        self._entries: dict[Hashable, _Entry] = {}
        self.builds: collections.Counter[str] = collections.Counter()
        self.reuses: collections.Counter[str] = collections.Counter()
        self.invalidations = 0

    @staticmethod
    def current_step() -> object | None:
        """The forward pass now running (its ForwardContext), or None where nothing may
        be memoized: switch off, no context, or vLLM's dummy run (no metadata dict)."""
        if not enabled() or not is_forward_context_available():
            return None
        context = get_forward_context()
        if not isinstance(context.attn_metadata, dict):
            return None
        return context

    def invalidate(self) -> None:
        """Forget every entry (and the pass they belonged to)."""
        if self._entries or self._step is not None:
            self.invalidations += 1
        self._entries.clear()
        self._step = None

    def reset_counts(self) -> None:
        self.builds.clear()
        self.reuses.clear()
        self.invalidations = 0

    def active(self, role: LayerRole | None) -> bool:
        """Whether ``get`` may be used now; when not, the caller takes its ordinary
        (build-every-layer) path."""
        return role is not None and self.current_step() is not None

    def get(
        self,
        kind: str,
        slot: Hashable,
        key: tuple[Hashable, ...],
        anchors: tuple[object, ...],
        role: LayerRole,
        build: Callable[[], T],
        *,
        reads_topk: bool,
    ) -> T:
        """The memoized value of ``build()`` for this pass, building it on a miss.

        Call only where ``active(role)``. ``slot`` holds one entry (a later group's
        build replaces an earlier group's, so at most one group's values are held);
        ``reads_topk``: the value depends on the shared Top-K rows, so an index source
        always rebuilds it."""
        step = self.current_step()
        if step is None:
            raise RuntimeError("StepMemo.get outside a forward pass: check active() first")
        if self._step is not step:
            self.invalidate()
            self._step = step
        entry = self._entries.get(slot)
        if (
            entry is not None
            and not (reads_topk and role.writes_topk)
            and role.layer_id > entry.last_layer
            and entry.key == key
            and _same_objects(entry.anchors, anchors)
        ):
            entry.last_layer = role.layer_id
            self.reuses[kind] += 1
            return entry.value
        # Drop the stale entry before building, so its tensors are free for the new one.
        self._entries.pop(slot, None)
        value = build()
        self._entries[slot] = _Entry(key, anchors, value, role.layer_id)
        self.builds[kind] += 1
        return value


# The process's memo: all layers of a model (and of a draft model, which runs under its
# own forward contexts) share it.
MEMO = StepMemo()

__all__ = ["ENV_VAR", "MEMO", "LayerRole", "StepMemo", "enabled"]
