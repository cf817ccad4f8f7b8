"""YOCO reuse in the Ampere attention layer (vllm_plugin/yoco.py), real vLLM 0.33.0, on the
tier's device (the ``device`` fixture: CPU with the Triton interpreter, or the GPU tier's
CUDA device, where the kernels need CUDA tensors).

A "step" here is a run of our layer's ``_forward_decode`` / ``_forward_prefill`` for a
sequence of layers of one sharing group (ratio 1: layers 20-25, index sources 20 and
24, kv source 20), under one vLLM ``ForwardContext``, on real vLLM metadata built as in
test_attention.py. Between layers 23 and 24 the test rewrites the shared Top-K rows in
place, as index source 24's indexer does.

What each test proves:
- the switch: ``DEEPINFER_YOCO`` unset/1 = on, 0 = off;
- counts per step (the layer's op calls, counted by wrappers): decode Top-K slot
  conversions 6 -> 2 (one per index group), prefill chunk plans 6 -> 1, combined index
  builds 6 -> 2 per chunk, single-chunk and two-chunk steps; gathers unchanged
  (2 per layer per chunk: compressed history and SWA tail; not reused, see yoco.py);
- bit-identity: every input the attention kernels read (Top-K slots and lengths; combined
  index rows and lengths, and the workspace rows they select) equals, bit for bit, the
  no-reuse path's, layer by layer; and with the real kernels, the outputs are equal bit
  for bit and match the reference;
- invalidation: a new forward context drops every entry; a layer that is an index
  source never reuses Top-K-dependent entries; a repeated pass under the same context
  and metadata objects (DSpark-like: metadata and Top-K rows updated in place, with or
  without the index source) rebuilds; other metadata objects are never matched;
- through vLLM's inherited ``forward_mqa`` (mixed batch, warm-up reservation, locked
  workspace): an index source and a consumer both match the reference, with reuse;
- no forward context (direct calls, vLLM's dummy run) or no topology attributes: no
  memo at all, every layer builds (the test_attention.py tests run that way).

What cannot run without a GPU: CUDA-graph capture and replay with reuse (FULL decode
graphs, where the consumers read the index source's conversion output inside the graph;
piecewise graphs, where attention runs eagerly at replay), vLLM's real forward over 40
layers (indexer, MoE between layers), and timings; the serving A/B (DEEPINFER_YOCO=0/1)
measures those.
"""

from __future__ import annotations

import pytest
import torch

from tools.tiers import import_or_skip

from .test_attention import (
    MLA_PREFIX,
    PREFILLS,
    SMALL,
    SWA_PREFIX,
    Shapes,
    _check,
    make_batch,
    make_layer,
    workspace_manager,  # noqa: F401  (a fixture, used through usefixtures)
)

pytestmark = pytest.mark.vllm
vllm = import_or_skip("vllm")

from vllm.config import DeviceConfig, VllmConfig  # noqa: E402
from vllm.forward_context import create_forward_context, override_forward_context  # noqa: E402

from deepinfer_sm80.vllm_plugin import attention as ampere  # noqa: E402
from deepinfer_sm80.vllm_plugin import yoco  # noqa: E402
from tools.poison import nan_empty  # noqa: E402

LAYERS = (20, 21, 22, 23, 24, 25)
INDEX_SOURCES = (20, 24)
DECODES = (40, 1, 61)
CONFIG = VllmConfig(device_config=DeviceConfig(device="cpu"))


@pytest.fixture(autouse=True)
def memo(monkeypatch):
    monkeypatch.delenv(yoco.ENV_VAR, raising=False)
    yoco.MEMO.invalidate()
    yoco.MEMO.reset_counts()
    yield yoco.MEMO
    yoco.MEMO.invalidate()


@pytest.fixture
def counts(monkeypatch):
    """Counting wrappers around the ops the layer calls."""
    seen = {"topk": 0, "combine": 0, "gather": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            seen[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for name, attr in (
        ("topk", "compute_global_topk_indices_and_lens"),
        ("combine", "combine_topk_swa_indices"),
        ("gather", "dequantize_and_gather_k_cache"),
    ):
        monkeypatch.setattr(ampere, attr, counting(name, getattr(ampere, attr)))
    return seen


@pytest.fixture
def recorded(monkeypatch):
    """Stand-ins for the attention kernels (the interpreter is slow): they record, per
    call, exactly what the kernel would read, and write zeros."""
    calls = []

    def decode(q, swa_cache, swa_idx, swa_lens, scale, sink, cache, slots, lens, *, out,
               num_heads):  # fmt: skip
        calls.append(tuple(None if t is None else t.clone() for t in (swa_idx, swa_lens,
                                                                       slots, lens)))  # fmt: skip
        out[:, :num_heads].zero_()

    def prefill(q, kv, indices, scale, sink, lengths, *, out):
        width = indices.shape[1]
        read = torch.arange(width, device=indices.device)[None, :] < lengths[:, None].long()
        read &= indices >= 0  # -1 holes inside the count are skipped by the kernel
        calls.append((indices.clone(), lengths.clone(), kv[indices.long()[read]].clone()))
        out.zero_()

    monkeypatch.setattr(ampere, "sparse_mla_decode", decode)
    monkeypatch.setattr(ampere, "sparse_mla_prefill", prefill)
    return calls


def group(b, ids=LAYERS, index_sources=INDEX_SOURCES, kv_source=20):
    """Layers of one sharing group on the batch's caches and shared Top-K buffer, with
    the topology attributes vLLM's __init__ sets."""
    layers = []
    for i in ids:
        layer = make_layer(
            b.shapes, b.ratio, b.swa_cache, b.comp_cache, b.layer.topk_indices_buffer,
            b.layer.attn_sink, b.layer.PREFILL_CHUNK_SIZE,
        )  # fmt: skip
        layer.layer_id = i
        layer.kv_source_layer_id = kv_source if b.ratio else None
        layer.index_source_layer_id = max(s for s in index_sources if s <= i) if b.ratio else None
        layer.is_index_source = i in index_sources
        # The metadata key of the kv source (the test batches file it under MLA_PREFIX).
        layer.compressed_cache_prefix = MLA_PREFIX if b.ratio else None
        layers.append(layer)
    return layers


def rewrite_topk(b, salt: int) -> None:
    """What an index source's indexer does to the shared rows: new rows, in place (here:
    each token's counted prefix rolled by ``salt``, so every row stays valid)."""
    buf = b.layer.topk_indices_buffer
    for t, p in enumerate(b.positions.tolist()):
        if t < b.num_decode_tokens:
            k = int((buf[t] >= 0).sum())
        else:
            k = min((p + 1) // b.ratio, b.shapes.topk)
        if k > 1:
            buf[t, :k] = torch.roll(buf[t, :k].clone(), salt % k)


def context(b):
    return create_forward_context({SWA_PREFIX: b.swa_md, MLA_PREFIX: b.mla_md}, CONFIG)


def decode(layer, b, out=None):
    out = nan_empty(*b.q.shape, device=b.q.device) if out is None else out
    layer._forward_decode(
        q=b.q, kv_cache=b.comp_cache, swa_metadata=b.swa_md, attn_metadata=b.mla_md,
        swa_only=b.ratio == 0, output=out,
    )  # fmt: skip
    return out


def prefill(layer, b, out=None):
    out = nan_empty(*b.q.shape, device=b.q.device) if out is None else out
    layer._forward_prefill(
        q=b.q, positions=b.positions, compressed_k_cache=b.comp_cache, swa_k_cache=b.swa_cache,
        output=out, attn_metadata=b.mla_md, swa_metadata=b.swa_md,
    )  # fmt: skip
    return out


def run_step(b, layers, forward, *, rewrite_before=24):
    """One step: the layers in order under one forward context; the shared Top-K rows
    are rewritten before layer ``rewrite_before`` (index source 24's indexer)."""
    with override_forward_context(context(b)):
        for layer in layers:
            if layer.layer_id == rewrite_before:
                rewrite_topk(b, salt=layer.layer_id)
            forward(layer, b)


def assert_same_calls(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for a, c in zip(g, w, strict=True):
            assert (a is None) == (c is None), f"call {i}"
            if a is not None:
                assert a.dtype == c.dtype and a.shape == c.shape, f"call {i}"
                assert torch.equal(a.view(torch.uint8), c.view(torch.uint8)), (
                    f"call {i}: kernel input differs bit-wise from the no-reuse path"
                )


def plan_counter(monkeypatch, b):
    calls = []
    original = b.swa_md.get_prefill_chunk_plan

    def plan(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(b.swa_md, "get_prefill_chunk_plan", plan, raising=False)
    return calls


# ---------------------------------------------------------------- switch and memo rules


@pytest.mark.parametrize(
    "value,on", [(None, True), ("1", True), ("0", False), (" 0 ", False), ("yes", True)]
)
def test_switch(monkeypatch, value, on):
    if value is not None:
        monkeypatch.setenv(yoco.ENV_VAR, value)
    assert yoco.enabled() is on


def test_memo_rules(device):
    """Keys, identity anchors, index-source rebuild, layer order, step change."""
    memo = yoco.StepMemo()
    a, other = torch.zeros(3), torch.zeros(3)  # equal values, different objects
    role = lambda i, writes=False: yoco.LayerRole(i, 20, writes)  # noqa: E731
    built = []

    def get(layer_role, key=(1,), anchors=(a,), reads_topk=True):
        return memo.get("k", "slot", key, anchors, layer_role,
                        lambda: built.append(1) or len(built), reads_topk=reads_topk)  # fmt: skip

    assert not memo.active(role(21))  # no forward context
    with pytest.raises(RuntimeError, match="active"):
        get(role(21))
    b = make_batch(SMALL, 1, DECODES[:1], (), seed=1, device=device)
    with override_forward_context(context(b)):
        assert memo.active(role(21)) and not memo.active(None)
        assert get(role(20, writes=True)) == 1
        assert get(role(21)) == 1  # reused
        assert get(role(22), key=(2,)) == 2  # other key
        assert get(role(23), anchors=(other,)) == 3  # equal values, other object
        assert get(role(23), anchors=(other,)) == 4  # order: 23 used it (a new pass)
        assert get(role(24, writes=True), anchors=(other,)) == 5  # an index source rebuilds
        assert get(role(25, writes=True), anchors=(other,), reads_topk=False) == 5
        assert get(role(26), anchors=(other,)) == 5
    assert memo.builds["k"] == 5 and memo.reuses["k"] == 3
    with override_forward_context(context(b)):  # a new pass: everything dropped
        assert get(role(27)) == 6
    assert memo.invalidations == 1


def test_role_from_vllm_attributes(device):
    b = make_batch(SMALL, 1, DECODES[:1], (), seed=2, device=device)
    assert yoco.LayerRole.of(b.layer) is None  # no layer_id: no reuse
    src, consumer = group(b, ids=(24, 25))
    assert yoco.LayerRole.of(src) == yoco.LayerRole(24, 24, True)
    assert yoco.LayerRole.of(consumer) == yoco.LayerRole(25, 24, False)
    b0 = make_batch(SMALL, 0, DECODES[:1], (), seed=2, device=device)
    assert yoco.LayerRole.of(group(b0, ids=(1,))[0]) == yoco.LayerRole(1, None, False)


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("on", [True, False], ids=["yoco", "off"])
def test_decode_counts(monkeypatch, counts, recorded, memo, on, device):
    if not on:
        monkeypatch.setenv(yoco.ENV_VAR, "0")
    b = make_batch(SMALL, 1, DECODES, (), seed=10, device=device)
    run_step(b, group(b), decode)
    assert counts["topk"] == (2 if on else 6)  # one per index group vs one per layer
    assert memo.builds[yoco.DECODE_TOPK] == (2 if on else 0)
    assert memo.reuses[yoco.DECODE_TOPK] == (4 if on else 0)


def test_decode_inputs_bit_identical(monkeypatch, recorded, device):
    b = make_batch(SMALL, 1, DECODES, (), seed=11, device=device)
    saved = b.layer.topk_indices_buffer.clone()
    run_step(b, group(b), decode)
    with_reuse = list(recorded)
    recorded.clear()
    b.layer.topk_indices_buffer.copy_(saved)
    monkeypatch.setenv(yoco.ENV_VAR, "0")
    run_step(b, group(b), decode)
    assert_same_calls(with_reuse, recorded)
    # The rewrite before layer 24 is seen: its slots differ from layer 23's.
    assert not torch.equal(with_reuse[3][2], with_reuse[4][2])


def test_no_forward_context_builds_every_layer(counts, recorded, memo, device):
    b = make_batch(SMALL, 1, DECODES, (), seed=12, device=device)
    for layer in group(b):
        decode(layer, b)
    assert counts["topk"] == len(LAYERS) and not memo.builds and not memo.reuses


def test_new_step_invalidates(counts, recorded, memo, device):
    """Step 2 (new forward context, new metadata) starts at a consumer: it must not
    see step 1's slots."""
    b1 = make_batch(SMALL, 1, DECODES, (), seed=13, device=device)
    b2 = make_batch(SMALL, 1, DECODES, (), seed=14, device=device)
    run_step(b1, group(b1, ids=(20, 21)), decode)
    assert counts["topk"] == 1
    run_step(b2, group(b2, ids=(21, 22)), decode)  # same layer ids, new step
    assert counts["topk"] == 2 and memo.invalidations == 1
    # Same step object but other metadata (another SWA group): no match either.
    with override_forward_context(context(b2)):
        l21, l22 = group(b2, ids=(21, 22))
        decode(l21, b2)
        decode(l22, b1)
    assert counts["topk"] == 4
    # What step 2's consumer got is its own batch's conversion.
    want = ampere.compute_global_topk_indices_and_lens(
        b2.layer.topk_indices_buffer[: b2.num_decode_tokens],
        b2.swa_md.token_to_req_indices,
        b2.mla_md.block_table[: b2.swa_md.num_decodes],
        b2.mla_md.block_size,
        b2.swa_md.is_valid_token[: b2.num_decode_tokens],
    )
    assert torch.equal(recorded[2][2], want[0]) and torch.equal(recorded[2][3], want[1])


@pytest.mark.parametrize("producer", [True, False], ids=["with-source", "consumers-only"])
def test_repeated_pass_same_objects_rebuilds(monkeypatch, counts, recorded, producer, device):
    """DSpark-like: a second decode pass under the same context and metadata objects,
    whose Top-K rows and validity were updated in place, never reads the first
    pass's slots."""

    def two_passes(b):
        with override_forward_context(context(b)):
            for layer in group(b, ids=(20, 21, 22)):
                decode(layer, b)
            rewrite_topk(b, salt=5)
            b.swa_md.is_valid_token[0] = False  # metadata updated in place
            for layer in group(b, ids=(20, 21, 22) if producer else (21, 22)):
                decode(layer, b)

    b = make_batch(SMALL, 1, DECODES, (), seed=15, device=device)
    saved = (b.layer.topk_indices_buffer.clone(), b.swa_md.is_valid_token.clone())
    two_passes(b)
    assert counts["topk"] == 2  # one per pass
    with_reuse = list(recorded)
    recorded.clear()
    b.layer.topk_indices_buffer.copy_(saved[0])
    b.swa_md.is_valid_token.copy_(saved[1])
    monkeypatch.setenv(yoco.ENV_VAR, "0")
    two_passes(b)
    assert_same_calls(with_reuse, recorded)
    assert int(with_reuse[-1][3][0]) == 0  # the second pass saw the in-place update


def test_decode_real_kernel_bit_identical(monkeypatch, device):
    """The real decode kernel: index source + consumer, with and without reuse."""
    b = make_batch(SMALL, 1, DECODES, (), seed=16, device=device)
    outs = {}
    for on in (True, False):
        monkeypatch.setenv(yoco.ENV_VAR, "1" if on else "0")
        with override_forward_context(context(b)):
            outs[on] = [decode(layer, b) for layer in group(b, ids=(20, 21))]
    assert yoco.MEMO.reuses[yoco.DECODE_TOPK] == 1
    h = b.shapes.heads
    for a, c in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a[:, :h].view(torch.int16), c[:, :h].view(torch.int16))
    _check("decode consumer with reuse", b, outs[True][1])


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("chunk_size,chunks", [(4, 1), (1, 2)], ids=["1-chunk", "2-chunks"])
@pytest.mark.usefixtures("workspace_manager")
def test_prefill_counts_and_inputs(
    monkeypatch,
    counts,
    recorded,
    memo,
    chunk_size,
    chunks,
    device,
):
    b = make_batch(SMALL, 1, (), PREFILLS, seed=20, device=device, chunk_size=chunk_size)
    plans = plan_counter(monkeypatch, b)
    saved = b.layer.topk_indices_buffer.clone()
    run_step(b, group(b), prefill)
    n = len(LAYERS)
    assert len(plans) == 1  # one plan for the step (vs one per layer)
    assert counts["combine"] == 2 * chunks  # per index group and chunk
    assert counts["gather"] == 2 * chunks * n  # not reused: every layer gathers
    assert memo.builds[yoco.PREFILL_PLAN] == 1 and memo.reuses[yoco.PREFILL_PLAN] == n - 1
    assert memo.reuses[yoco.PREFILL_INDICES] == (n - 2) * chunks
    with_reuse = list(recorded)

    recorded.clear()
    plans.clear()
    for key in counts:
        counts[key] = 0
    b.layer.topk_indices_buffer.copy_(saved)
    monkeypatch.setenv(yoco.ENV_VAR, "0")
    run_step(b, group(b), prefill)
    assert (len(plans), counts["combine"], counts["gather"]) == (n, n * chunks, 2 * chunks * n)
    assert len(with_reuse) == n * chunks
    assert_same_calls(with_reuse, recorded)
    # Layer 24 saw the rewritten rows (its combined rows differ from layer 23's).
    assert not torch.equal(with_reuse[3 * chunks][0], with_reuse[4 * chunks][0])


@pytest.mark.usefixtures("workspace_manager")
def test_prefill_plan_shared_across_ratios_only_within_a_ratio(
    monkeypatch,
    counts,
    recorded,
    memo,
    device,
):
    """SWA-only layers 0-1 share a plan, and their combined rows (no Top-K read);
    a compressed layer after them builds its own plan."""
    b0 = make_batch(SMALL, 0, (), PREFILLS, seed=21, device=device)
    with override_forward_context(context(b0)):
        for layer in group(b0, ids=(0, 1)):
            prefill(layer, b0)
        assert memo.builds[yoco.PREFILL_PLAN] == 1 and memo.reuses[yoco.PREFILL_PLAN] == 1
        assert memo.reuses[yoco.PREFILL_INDICES] == 2  # two chunks, layer 1 reuses layer 0's
        compressed = group(b0, ids=(2,))[0]
        compressed.compress_ratio = 2  # same metadata, another ratio: another plan
        compressed.index_source_layer_id = 2
        assert yoco.LayerRole.of(compressed) == yoco.LayerRole(2, 2, True)
        plan = compressed._prefill_chunk_plan(b0.swa_md)
    assert memo.builds[yoco.PREFILL_PLAN] == 2
    assert plan == tuple(b0.swa_md.get_prefill_chunk_plan(2, 1, has_compressed=True))


@pytest.mark.usefixtures("workspace_manager")
def test_prefill_real_kernel_bit_identical(monkeypatch, device):
    """The real prefill kernels (2 heads, to stay quick): index source + consumer. All three
    prefills (15 tokens): the relative-norm half of the budget is a statistic, and over the
    first two alone (12 tokens x 2 heads) it swung to 1.44x PyTorch-bf16's with every
    token's error at bf16 rounding level."""
    s = Shapes(heads=2)
    b = make_batch(s, 1, (), PREFILLS, seed=22, device=device, chunk_size=4)
    outs = {}
    for on in (True, False):
        monkeypatch.setenv(yoco.ENV_VAR, "1" if on else "0")
        with override_forward_context(context(b)):
            outs[on] = [prefill(layer, b) for layer in group(b, ids=(20, 21))]
    assert yoco.MEMO.reuses[yoco.PREFILL_INDICES] == 1
    for a, c in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a[:, :2].view(torch.int16), c[:, :2].view(torch.int16))
    _check("prefill consumer with reuse", b, outs[True][1])


def test_mixed_batch_through_forward_mqa(workspace_manager, device):  # noqa: F811
    """vLLM's forward_mqa (inherited) on a mixed batch, for an index source and a
    consumer, after the warm-up reservation with the workspace locked: both layers match
    the reference, and the consumer reused the decode slots, plan and index rows."""
    b = make_batch(Shapes(heads=2), 1, DECODES, PREFILLS[:2], seed=23, device=device)
    layers = group(b, ids=(20, 21))
    out = nan_empty(*b.q.shape, device=device)
    with override_forward_context(create_forward_context(None, CONFIG)):
        layers[0].forward_mqa(b.q, torch.empty(0), b.positions, out)  # warm-up (dummy) run
    assert not yoco.MEMO.builds  # nothing memoized on the dummy run
    workspace_manager.lock()
    with override_forward_context(context(b)):
        for layer in layers:
            out = nan_empty(*b.q.shape, device=device)
            layer.forward_mqa(b.q, torch.empty(0), b.positions, out)
            _check(f"forward_mqa layer {layer.layer_id}", b, out)
    for kind in (yoco.DECODE_TOPK, yoco.PREFILL_PLAN, yoco.PREFILL_INDICES):
        assert yoco.MEMO.reuses[kind] >= 1, kind
