"""The pipeline relay of layer-source caches (deepinfer_sm80.vllm_plugin.pp_relay).

- records: pack/unpack of per-slot records for every record width, page strides that
  differ between ranks, slots of -1, padded token counts, zero tokens;
- a mirror filled only by the relay decodes bit-identically to the source cache, with
  our writers and gather and with vLLM 0.33.0's own (its Triton writers fill the source,
  its ``dequantize_and_gather_k_cache_triton`` decodes both, under the interpreter);
- construction against the real vLLM 0.33.0 DeepSeek-V4.1 model with a tiny config that
  keeps the 40-layer topology (in a subprocess: it fakes the pipeline group and stubs the
  CUDA-only pieces), the relay glue on the built stages, the relay keys, and vLLM's own
  KV planning over the stages' specs (groups as at PP=1, mirrors beside their owner);
- a payload sent over gloo between two processes with vLLM's own PP send/recv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.vllm_plugin.pp_relay import records
from tools.tiers import import_or_skip

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


# ---------------------------------------------------------------------------------------
# records (pure torch)


def paged(num_blocks: int, block_size: int, width: int, pad: int, fill: int = 0xFF, device="cpu"):
    """A [num_blocks, block_size, width] uint8 cache whose pages are ``pad`` bytes
    longer than their records (as when vLLM packs several layers into one block)."""
    stride = block_size * width + pad
    raw = torch.full((num_blocks * stride,), fill, dtype=torch.uint8, device=device)
    return raw.as_strided((num_blocks, block_size, width), (stride, width, 1))


def record_ref(cache: torch.Tensor, slot: int) -> torch.Tensor:
    """Slot ``slot``'s record bytes, read with the layout written out longhand."""
    layout = records.LAYOUTS[cache.shape[-1]]
    bs, stride = cache.shape[1], cache.stride(0)
    flat = cache.as_strided((cache.shape[0] * stride,), (1,))
    b, o = divmod(slot, bs)
    data = flat[b * stride + o * layout.data_bytes :][: layout.data_bytes]
    start = b * stride + bs * layout.data_bytes + o * layout.scale_bytes
    return torch.cat([data, flat[start : start + layout.scale_bytes]])


def raw_bytes(cache: torch.Tensor) -> torch.Tensor:
    return cache.as_strided((cache.shape[0] * cache.stride(0),), (1,)).clone()


@pytest.mark.parametrize("width", sorted(records.LAYOUTS))
def test_round_trip_every_width_across_page_strides(width):
    g = torch.Generator().manual_seed(width)
    bs, blocks = 16, 5
    src = paged(blocks, bs, width, pad=40)
    raw = src.as_strided((blocks * src.stride(0),), (1,))
    raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))
    dst = paged(blocks, bs, width, pad=576 * 3 + 8)  # another rank's packing
    before = raw_bytes(dst)
    slots = torch.tensor([17, -1, 3, 79, 40, -1, 0], dtype=torch.int64)
    payload = torch.full((11, width), 0xAB, dtype=torch.uint8)  # padded token count
    records.pack_records(src, slots, payload)
    for i, s in enumerate(slots.tolist()):
        want = record_ref(src, s) if s >= 0 else torch.zeros(width, dtype=torch.uint8)
        assert torch.equal(payload[i], want), (i, s)
    assert payload[len(slots) :].eq(0).all()
    records.unpack_records(payload, slots.to(torch.int32), dst)
    for s in range(blocks * bs):
        if s in slots.tolist():
            assert torch.equal(record_ref(dst, s), record_ref(src, s)), s
        else:
            assert record_ref(dst, s).eq(0xFF).all(), f"slot {s} written"
    # Only the relayed records' bytes changed: page padding and other slots untouched.
    changed = (raw_bytes(dst) != before).nonzero().flatten()
    allowed = set()
    for s in slots.tolist():
        if s >= 0:
            b, o = divmod(s, bs)
            lay = records.LAYOUTS[width]
            base = b * dst.stride(0)
            allowed |= set(range(base + o * lay.data_bytes, base + (o + 1) * lay.data_bytes))
            start = base + bs * lay.data_bytes + o * lay.scale_bytes
            allowed |= set(range(start, start + lay.scale_bytes))
    assert set(changed.tolist()) <= allowed


def test_all_slots_negative_and_zero_tokens_write_nothing():
    src = paged(2, 8, 584, pad=0, fill=7)
    dst = paged(2, 8, 584, pad=24)
    before = raw_bytes(dst)
    payload = torch.empty((4, 584), dtype=torch.uint8)
    slots = torch.full((3,), -1, dtype=torch.int64)
    records.pack_records(src, slots, payload)
    assert payload.eq(0).all()
    payload.fill_(9)  # even a payload full of bytes must not land anywhere
    records.unpack_records(payload, slots, dst)
    records.unpack_records(payload, slots[:0], dst)
    records.pack_records(src, slots[:0], payload)
    assert torch.equal(raw_bytes(dst), before)
    assert payload.eq(0).all()


def test_rows_round_trip_with_maps():
    g = torch.Generator().manual_seed(1)
    buffer = torch.randint(0, 1 << 30, (12, 16), generator=g, dtype=torch.int32)
    out = torch.full((6, 16), -5, dtype=torch.int32)
    records.pack_rows(buffer, out)
    assert torch.equal(out, buffer[:6])
    target = torch.full((12, 16), -7, dtype=torch.int32)
    records.unpack_rows(out, target)
    assert torch.equal(target[:6], buffer[:6]) and target[6:].eq(-7).all()
    # Consumer-view maps: padded decode rows, -1 = no row.
    src_rows = torch.tensor([3, 8, -1, 0], dtype=torch.int64)
    records.pack_rows(buffer, out, src_rows)
    assert torch.equal(out[:2], buffer[[3, 8]]) and torch.equal(out[3], buffer[0])
    assert out[2].eq(0).all() and out[4:].eq(0).all()
    target.fill_(-7)
    records.unpack_rows(out, target, torch.tensor([9, 2, -1, 4]))
    assert torch.equal(target[9], buffer[3]) and torch.equal(target[2], buffer[8])
    assert torch.equal(target[4], out[3]) and target[[0, 1, 3, 5, 6, 7, 8, 10, 11]].eq(-7).all()


# Decode lengths per request, prefill tokens after them, padded (graph) tokens after those.
CANDIDATE_BATCHES = [
    pytest.param([1, 6], 0, 0, id="short-then-full: 12 padded rows > 7 tokens"),
    pytest.param([6, 1, 3], 4, 0, id="uneven with prefill rows overwritten"),
    pytest.param([5, 0, 6], 0, 2, id="a zero-length request and padding tokens"),
    pytest.param([2, 2, 2], 3, 1, id="uniform: identity"),
    pytest.param([4, 2], 9, 0, id="divisible but uneven: padded per vLLM"),
]


def _indexer_candidate_writes(lens, num_prefill, pad, width, g):
    """The candidate buffer as vLLM 0.33.0's source indexer leaves it, with vLLM's own
    ``pack_seq_triton`` placing decode rows: prefill rows token-absolute first, then
    decode rows ``[0, B * Lmax)`` in the padded layout when ``needs_padded_path``."""
    from vllm.v1.attention.ops.common import pack_seq_triton

    decode_lens = torch.tensor(lens, dtype=torch.int32)
    nd, batch, lmax = sum(lens), len(lens), max(lens)
    n = nd + num_prefill + pad
    padded = min(lens) != max(lens) or nd % batch != 0
    buffer = torch.full((max(n, batch * lmax) + 3, width), -3, dtype=torch.int32)
    buffer[nd : nd + num_prefill] = torch.randint(0, 1 << 20, (num_prefill, width), generator=g)
    decode_vals = torch.randint(0, 1 << 20, (nd, width), generator=g, dtype=torch.int32)
    # Which token each decode row holds (-1: a padding slot, computed from a zero query).
    owner = torch.arange(nd, dtype=torch.float32).unsqueeze(1)
    if padded:
        owner = pack_seq_triton(owner, decode_lens, pad_value=-1.0).reshape(-1).to(torch.int64)
        garbage = torch.full((width,), -77, dtype=torch.int32)
        rows = torch.stack([decode_vals[t] if t >= 0 else garbage for t in owner.tolist()])
        buffer[: rows.shape[0]] = rows
    else:
        owner = torch.arange(nd)
        buffer[:nd] = decode_vals
    return buffer, decode_lens, owner, n, padded


@pytest.mark.vllm
@pytest.mark.parametrize("lens,num_prefill,pad", CANDIDATE_BATCHES)
def test_candidate_rows_follow_the_indexers_padded_layout(lens, num_prefill, pad):
    import_or_skip("vllm")
    g = torch.Generator().manual_seed(sum(lens) * 7 + num_prefill)
    width = 16
    source, decode_lens, owner, n, padded = _indexer_candidate_writes(
        lens, num_prefill, pad, width, g
    )
    nd = sum(lens)
    row_map = records.candidate_rows(n, nd, decode_lens, padded)
    if not padded:
        assert row_map is None
    else:  # every decode token's padded row is where vLLM's pack put it
        for row, token in enumerate(owner.tolist()):
            if token >= 0:
                assert row_map[token] == row
        assert torch.equal(row_map[nd:], torch.arange(nd, n))
    # Send [n, width] in the consumer view, install into a poisoned receiver buffer.
    payload = torch.full((n, width), -5, dtype=torch.int32)
    records.pack_rows(source, payload, row_map)
    mirror = torch.full_like(source, -9)
    records.unpack_rows(payload, mirror, row_map)
    # What the consumer indexers read meaningfully equals the source rank's buffer:
    # every real decode row of the layout, and the prefill rows (quirk included).
    decode_rows = [r for r, t in enumerate(owner.tolist()) if t >= 0]
    read = decode_rows + list(range(nd, nd + num_prefill))
    assert torch.equal(mirror[read], source[read])
    if padded and len(owner) > n:  # rows [0, n) alone would lose real decode rows
        plain = torch.full_like(source, -9)
        records.unpack_rows(source[:n], plain)
        assert not torch.equal(plain[read], source[read])


@pytest.mark.vllm
def test_candidate_row_map_reads_vllms_indexer_metadata():
    import_or_skip("vllm")
    from vllm.v1.attention.backends.mla.indexer import (
        DeepSeekV32IndexerDecodeMetadata,
        DeepseekV32IndexerMetadata,
    )

    from deepinfer_sm80.vllm_plugin.pp_relay.relay import candidate_row_map

    def meta(lens, num_prefill_tokens, requires_padding):
        z = torch.zeros(1, dtype=torch.int32)
        decode = DeepSeekV32IndexerDecodeMetadata(
            block_table=z,
            seq_lens=z,
            decode_lens=torch.tensor(lens, dtype=torch.int32),
            requires_padding=requires_padding,
            schedule_metadata=z,
        )
        return DeepseekV32IndexerMetadata(
            seq_lens=z,
            max_seq_len=1,
            slot_mapping=z,
            num_decodes=len(lens),
            num_decode_tokens=sum(lens),
            num_prefills=int(num_prefill_tokens > 0),
            num_prefill_tokens=num_prefill_tokens,
            decode=decode,
        )

    name = "model.layers.20.attn.indexer.k_cache"
    uneven = meta([1, 6], 0, True)
    rows = candidate_row_map({name: uneven}, name, 7)
    assert rows.tolist() == [0, 6, 7, 8, 9, 10, 11]
    # A receiver without the source's index-K name uses another indexer's metadata.
    other = {"model.layers.28.attn": object(), "model.layers.31.attn.indexer.k_cache": uneven}
    assert torch.equal(candidate_row_map(other, name, 7), rows)
    # vLLM pads when the token count does not divide by the request count, too.
    assert candidate_row_map({name: meta([2, 1], 0, False)}, name, 3).tolist() == [0, 1, 2]
    assert candidate_row_map({name: meta([1, 2], 4, False)}, name, 7).tolist() == [
        0,
        2,
        3,
        3,
        4,
        5,
        6,
    ]
    # Identity: uniform decode, prefill only, no indexer metadata at all.
    assert candidate_row_map({name: meta([3, 3], 2, False)}, name, 8) is None
    prefill_only = meta([1], 5, False)
    prefill_only.num_decodes, prefill_only.decode = 0, None
    assert candidate_row_map({name: prefill_only}, name, 5) is None
    assert candidate_row_map({"model.layers.28.attn": object()}, name, 5) is None


def test_candidate_rows_refuse_what_cannot_be_laid_out():
    with pytest.raises(ValueError, match="decode_lens"):
        records.candidate_rows(4, 3, None, True)
    with pytest.raises(ValueError, match="num_decode_tokens"):
        records.candidate_rows(2, 3, torch.tensor([1, 2]), True)


def test_bad_inputs_name_the_argument():
    cache = paged(2, 8, 584, pad=0)
    with pytest.raises(ValueError, match="no known record layout is 100 bytes"):
        records.pack_records(
            paged(2, 8, 100, 0),
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, 100, dtype=torch.uint8),
        )
    with pytest.raises(ValueError, match="slots: 3 slots do not fit the payload's 2 rows"):
        records.pack_records(
            cache, torch.zeros(3, dtype=torch.int64), torch.zeros(2, 584, dtype=torch.uint8)
        )
    with pytest.raises(ValueError, match="payload: expected"):
        records.unpack_records(
            torch.zeros(2, 132, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64), cache
        )
    with pytest.raises(ValueError, match="slots: expected a 1-D int32/int64"):
        records.pack_records(
            cache, torch.zeros(1, dtype=torch.float32), torch.zeros(1, 584, dtype=torch.uint8)
        )


# ---------------------------------------------------------------------------------------
# a mirror fed only by the relay decodes like the source


def _writers_and_gather(impl: str):
    """The compressed-KV writer, the index-K writer and the record gather: ours, or vLLM
    0.33.0's own (its Triton kernels, run by the interpreter on CPU)."""
    if impl == "ours":
        from deepinfer_sm80.ops.cache_writers import indexer_k_norm_rope_store, rope_quant_insert
        from deepinfer_sm80.ops.kv_cache import dequantize_and_gather_k_cache

        return rope_quant_insert, indexer_k_norm_rope_store, dequantize_and_gather_k_cache
    ops = "vllm.models.deepseek_v41.common.ops"
    compress = import_or_skip(f"{ops}.fused_compress_quant_cache")
    indexer = import_or_skip(f"{ops}.indexer_k_store")
    cache_utils = import_or_skip(f"{ops}.cache_utils")
    return (
        compress.rope_quant_insert,
        indexer.indexer_k_norm_rope_store,
        cache_utils.dequantize_and_gather_k_cache_triton,
    )


@pytest.mark.parametrize("impl", ["ours", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_mirror_fed_by_relay_decodes_bit_identically(device, impl):
    rope_quant_insert, indexer_k_norm_rope_store, dequantize_and_gather_k_cache = (
        _writers_and_gather(impl)
    )
    g = torch.Generator().manual_seed(3)  # draws on the CPU, moved: the same values anywhere
    bs, blocks, max_pos = 16, 6, 256
    src_kv = paged(blocks, bs, 584, pad=8640 + 4, device=device)
    mir_kv = paged(blocks, bs, 584, pad=0, device=device)
    src_ik = paged(blocks, bs, 132, pad=37440, device=device)
    mir_ik = paged(blocks, bs, 132, pad=12, device=device)
    cos_sin = torch.randn(max_pos, 64, generator=g).to(device)
    k_norm = torch.randn(128, generator=g).to(torch.bfloat16).to(device)
    # Two requests with scattered blocks; three steps: prefill chunk, then decodes.
    table = torch.tensor([[4, 1, 5], [0, 3, 2]], dtype=torch.int32, device=device)
    lens = [0, 0]
    for step, new in enumerate([(21, 9), (1, 1), (6, 6)]):
        pos, slots = [], []
        for r, n in enumerate(new):
            for p in range(lens[r], lens[r] + n):
                pos.append(p)
                slots.append(int(table[r, p // bs]) * bs + p % bs)
            lens[r] += n
        slots.insert(3, -1)  # a padded token in the middle
        pos.insert(3, 0)
        t = len(slots)
        positions = torch.tensor(pos, dtype=torch.int64, device=device)
        slot_t = torch.tensor(slots, dtype=torch.int64, device=device)
        latent = (torch.randn(t, 512, generator=g) * 3).to(torch.bfloat16).to(device)
        k_pre = torch.randn(t, 128, generator=g).to(torch.bfloat16).to(device)
        rope_quant_insert(latent, positions, cos_sin, src_kv, slot_t, 1)
        indexer_k_norm_rope_store(k_pre, positions, cos_sin, k_norm, 1e-6, src_ik, slot_t, 1, False)
        rows = t + 5  # the runner pads the token count
        kv_payload = torch.empty(rows, 584, dtype=torch.uint8, device=device)
        ik_payload = torch.empty(rows, 132, dtype=torch.uint8, device=device)
        records.pack_records(src_kv, slot_t, kv_payload)
        records.pack_records(src_ik, slot_t, ik_payload)
        records.unpack_records(kv_payload, slot_t, mir_kv)
        records.unpack_records(ik_payload, slot_t, mir_ik)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        outs = []
        for cache in (src_kv, mir_kv):
            out = torch.full((2, 48, 512), float("nan"), dtype=torch.bfloat16, device=device)
            dequantize_and_gather_k_cache(out, cache, seq_lens, None, table, bs, 0)
            outs.append(out)
        for r, n in enumerate(lens):
            a, b = outs[0][r, :n].view(torch.int16), outs[1][r, :n].view(torch.int16)
            assert torch.equal(a, b), f"step {step} request {r}"
            assert not outs[1][r, :n].isnan().any()
        # Independent of the layouts in records.py: a page's first block_size * width
        # bytes are exactly its data and scale regions, so the [blocks, bs, width] views
        # of source and mirror (both poisoned 0xFF before) must agree byte for byte.
        assert torch.equal(src_kv, mir_kv) and torch.equal(src_ik, mir_ik), step


# ---------------------------------------------------------------------------------------
# topology: what crosses each cut


def test_relay_plan_for_the_shipped_topologies():
    keys = {c: [i.key for i in v] for c, v in mt.relay_plan([14, 14, 12]).items()}
    assert keys == {
        14: [],
        28: ["__dsv41pp.kv.20", "__dsv41pp.index_k.20", "__dsv41pp.candidates.20"],
    }
    assert mt.relay_bytes_per_token([14, 14, 12]) == {14: 0, 28: 584 + 132 + 8192}
    pp6 = {c: [(i.kind, i.source) for i in v] for c, v in mt.relay_plan([7, 7, 7, 7, 6, 6]).items()}
    l20 = [("kv", 20), ("index_k", 20), ("candidates", 20)]
    assert pp6 == {
        7: [("kv", 2), ("topk", 2)],
        14: [],
        21: [*l20, ("topk", 20)],
        28: l20,
        34: [*l20, ("topk", 32)],
    }
    for legal in ([20, 20], [14, 6, 20], [8, 12, 20], [2, 18, 20]):
        assert all(not items for items in mt.relay_plan(legal).values()), legal


@pytest.mark.vllm
def test_ledger_entry_swaps_only_the_model_class():
    import inspect

    import_or_skip("vllm")
    from deepinfer_sm80.vllm_plugin import apply, ledger
    from deepinfer_sm80.vllm_plugin.pp_relay import relay

    entry = next(e for e in ledger.LEDGER if e.name == "pp-relay")
    ((_, sites, ours),) = apply.plan_patches([entry])  # resolves, signatures equal
    assert ours is relay.PipelineRelayDeepseekV41LLMForCausalLM
    assert [f"{m.__name__}:{a}" for m, a in sites] == list(entry.targets)
    base = relay.v41.DeepseekV4Model
    assert ours.model_cls.__mro__[1] is base

    def params(fn):
        return [(q.name, q.default) for q in inspect.signature(fn).parameters.values()]

    for name in ("__init__", "forward", "make_empty_intermediate_tensors"):
        assert params(getattr(ours.model_cls, name)) == params(getattr(base, name)), name
    # Work in progress stays off until the relay is proven end to end on GPUs.
    assert not mt.PLUGIN_CAPABILITIES.relays_shared_kv
    assert not relay.relay_enabled({})
    assert relay.relay_enabled({relay.ENABLE_ENV: "1"})


# ---------------------------------------------------------------------------------------
# construction and relay glue on the real vLLM 0.33.0 model (subprocess)

_TINY_TEXT = dict(
    model_type="deepseek_v41_text",
    hidden_size=64,
    num_hidden_layers=40,
    num_nextn_predict_layers=3,
    vocab_size=256,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=512,
    qk_rope_head_dim=64,
    q_lora_rank=64,
    o_lora_rank=64,
    o_groups=8,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    sliding_window=128,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    compress_ratios=[*mt.COMPRESS_RATIOS, 0, 0, 0],
    kv_source_layer_ids=list(mt.KV_SOURCES),
    index_source_layer_ids=list(mt.INDEX_SOURCES),
    candidate_source_layer_id=mt.CANDIDATE_SOURCE,
    candidate_topk_blocks=64,
    candidate_block_size=8,
    index_n_heads=4,
    index_head_dim=128,
    index_topk=64,
    hc_mult=4,
    hc_sinkhorn_iters=2,
    hc_eps=1e-6,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=32,
    scoring_func="sqrtsoftplus",
    topk_method="noaux_tc",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    swiglu_limit=10.0,
    first_k_dense_replace=0,
    hidden_act="silu",
    n_group=1,
    topk_group=1,
    dspark_block_size=5,
    dspark_target_layer_ids=[37, 38, 39],
    dspark_markov_rank=8,
    dspark_noise_token_id=255,
    dspark_n_routed_experts=8,
    dspark_num_experts_per_tok=2,
)


def _write_tiny_model(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    config = dict(
        model_type="deepseek_v41",
        architectures=["DeepseekV41ForCausalLM"],
        text_config=_TINY_TEXT,
        vision_config={},
        torch_dtype="bfloat16",
    )
    (path / "config.json").write_text(json.dumps(config))


def _run_child(mode: str, tmp_path: Path, env_extra=None, timeout=500) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", **(env_extra or {}))
    # The child runs this file as a script: the repo root (tools/) and the overlay on its path.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "overlay"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    out = tmp_path / f"{mode}.json"
    proc = subprocess.run(
        [PY, __file__, mode, str(tmp_path), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.vllm
def test_stage3_of_14_14_12_raises_without_the_relay_and_builds_with_it(tmp_path):
    import_or_skip("vllm")
    _write_tiny_model(tmp_path / "tiny")
    got = _run_child("construct", tmp_path, {"DEEPINFER_PP_RELAY": "1"})
    # Stock vLLM 0.33.0 (and ours with the relay off): layer 28 finds no layer-20 cache.
    assert got["stock_rank2"].startswith(
        "NotImplementedError: Indexer K cache source model.layers.20.attn.indexer.k_cache not found"
    )
    assert got["relay_off_rank2"] == got["stock_rank2"]
    # With the relay every stage builds, and the mirrors' KV specs are the real ones.
    assert got["ranges"] == [[0, 14], [14, 28], [28, 40]]
    assert got["mirror_types"] == {
        "model.layers.20.attn": "CompressedKVMirror",
        "model.layers.20.attn.indexer.k_cache": "DeepseekV4IndexerCache",
    }
    assert got["mirror_specs"] == got["source_specs"]
    assert "state_content_bytes=584" in got["mirror_specs"]["model.layers.20.attn"]
    # Stage 3's persistent receive buffers declare the relay keys; stage 1 declares none.
    assert got["keys_rank2"] == {
        "hidden_states": [4, 4, 64],
        "pre_mix": [4, 4],
        "__dsv41pp.kv.20": [4, 584],
        "__dsv41pp.index_k.20": [4, 132],
        "__dsv41pp.candidates.20": [4, 64],
    }
    assert sorted(got["keys_rank1"]) == ["hidden_states", "pre_mix"]
    # The glue on the built stages: stage 2 packs after its forward, stage 3 installs
    # before its forward; the mirror then decodes like layer 20's cache.
    assert got["forward_order"] == ["forward", "pack", "install", "forward"]
    assert got["mirror_decodes_like_source"] is True
    assert got["candidates_relayed"] is True
    assert got["profile_run_keys"] == [
        "__dsv41pp.candidates.20",
        "__dsv41pp.index_k.20",
        "__dsv41pp.kv.20",
        "hidden_states",
        "pre_mix",
    ]
    # DSpark over PP: aux layers on the last stage after its first layer are accepted.
    assert got["aux_ok"] is True and "not on the last stage" in got["aux_bad"]
    # vLLM's own KV planning over the three stages' specs (design T4). The groups of the
    # whole model are those of the same model at PP=1: a mirror under another name, or
    # a spec that differs from its owner's (vLLM asserts on that while merging), would
    # change or break them. Stage 3 declares layer 20's mirrors, and its KV tensors
    # give them pages: a mirror sits in its owner's group by name, so the scheduler's
    # block ids address the same records on stages 2 and 3.
    plan = got["kv_planning"]
    assert plan["groups_equal_pp1"] is True and plan["num_groups"] > 1
    mirrors = ["model.layers.20.attn", "model.layers.20.attn.indexer.k_cache"]
    assert plan["mirror_layers_on_stage3"] == mirrors
    assert plan["stage3_tensor_names"] == mirrors


def _child_construct(tmp: Path, out: Path) -> None:
    """Build DeepseekV4Model for each fake PP rank of 14,14,12 on CPU."""
    import types

    os.environ["VLLM_PP_LAYER_PARTITION"] = "14,14,12"
    import vllm.models.deepseek_v41.nvidia.flashmla as flashmla
    import vllm.models.deepseek_v41.nvidia.model as v41
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed import parallel_state as ps
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.forward_context import create_forward_context, override_forward_context
    from vllm.sequence import IntermediateTensors
    from vllm.v1.attention.backends.mla.indexer import (
        DeepSeekV32IndexerDecodeMetadata,
        DeepseekV32IndexerMetadata,
    )

    from deepinfer_sm80.ops.cache_writers import indexer_k_norm_rope_store, rope_quant_insert
    from deepinfer_sm80.ops.kv_cache import dequantize_and_gather_k_cache
    from deepinfer_sm80.vllm_plugin.pp_relay import relay

    # What cannot run on a CPU: CUDA streams/events, the FlashMLA o-proj recipe (asks
    # the device), and the MoE (its backend oracle fails on UnspecifiedPlatform). None
    # of them touches the sharing topology or the caches.
    class NoStream:
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, *args):
            pass

    torch.cuda.Stream = NoStream
    torch.cuda.Event = NoStream
    flashmla.compute_fp8_einsum_recipe = lambda *a, **k: (None, False)
    flashmla.register_dsv41_o_proj_warmup = lambda *a, **k: None

    class NoMoE(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

    v41.DeepseekV4MoE = NoMoE
    pp = types.SimpleNamespace(
        rank_in_group=0, world_size=3, is_first_rank=True, is_last_rank=False
    )
    ps.get_pp_group = lambda: pp
    v41.get_pp_group = lambda: pp

    def config():
        model = ModelConfig(
            model=str(tmp / "tiny"), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096
        )
        return VllmConfig(
            model_config=model,
            device_config=DeviceConfig(device="cpu"),
            cache_config=CacheConfig(block_size=64, cache_dtype="fp8"),
        )

    def build(rank, cls):
        pp.rank_in_group, pp.is_first_rank, pp.is_last_rank = rank, rank == 0, rank == 2
        vc = config()
        with set_current_vllm_config(vc):
            return cls(vllm_config=vc, prefix="model"), vc

    result = {}
    base = config()
    with set_current_vllm_config(base):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method="tcp://127.0.0.1:0",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)

    def error_of(rank, cls):
        try:
            build(rank, cls)
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        return "built"

    result["stock_rank2"] = error_of(2, v41.DeepseekV4Model)
    os.environ.pop(relay.ENABLE_ENV)
    result["relay_off_rank2"] = error_of(2, relay.PipelineRelayDeepseekV4Model)
    os.environ[relay.ENABLE_ENV] = "1"

    models = [build(r, relay.PipelineRelayDeepseekV4Model) for r in range(3)]
    result["ranges"] = [[m.start_layer, m.end_layer] for m, _ in models]
    (m1, vc1), (m2, vc2) = models[1], models[2]
    ctx1 = vc1.compilation_config.static_forward_context
    ctx2 = vc2.compilation_config.static_forward_context
    names = ["model.layers.20.attn", "model.layers.20.attn.indexer.k_cache"]
    result["mirror_types"] = {n: type(ctx2[n]).__name__ for n in names}
    result["source_specs"] = {n: repr(ctx1[n].get_kv_cache_spec(vc1)) for n in names}
    result["mirror_specs"] = {n: repr(ctx2[n].get_kv_cache_spec(vc2)) for n in names}
    for key, model in (("keys_rank2", m2), ("keys_rank1", m1)):
        tensors = model.make_empty_intermediate_tensors(4, torch.bfloat16, "cpu")
        result[key] = {k: list(v.shape) for k, v in tensors.tensors.items()}

    # Bind pages like the runner does ([blocks, 1, block_size, width], packed strides
    # that differ between the two ranks) and run the relay glue around a stub forward.
    bs, blocks = 64, 3

    def pages(width, stride):
        raw = torch.full((blocks * stride,), 0xFF, dtype=torch.uint8)
        return raw.as_strided((blocks, 1, bs, width), (stride, stride, width, 1))

    ctx1[names[0]].bind_kv_cache(pages(584, 37440 + 8640))
    ctx1[names[1]].bind_kv_cache(pages(132, 8640 + 37440 + 576))
    ctx2[names[0]].bind_kv_cache(pages(584, 37440))
    ctx2[names[1]].bind_kv_cache(pages(132, 8640))
    g = torch.Generator().manual_seed(0)
    t = 7
    slots = torch.tensor([64, 65, 66, -1, 130, 131, 0], dtype=torch.int64)
    positions = torch.tensor([0, 1, 2, 0, 0, 1, 9], dtype=torch.int64)
    # An eager step with uneven decode lengths (1 and 6 tokens, no prefill): the
    # indexer lays decode candidate rows out padded, 2 x 6 = 12 rows for 7 tokens.
    z = torch.zeros(1, dtype=torch.int32)
    uneven = DeepSeekV32IndexerDecodeMetadata(
        block_table=z,
        seq_lens=z,
        decode_lens=torch.tensor([1, 6], dtype=torch.int32),
        requires_padding=True,
        schedule_metadata=z,
    )
    meta = {
        names[0]: types.SimpleNamespace(slot_mapping=slots),
        names[1]: DeepseekV32IndexerMetadata(
            seq_lens=z,
            max_seq_len=1,
            slot_mapping=slots,
            num_decodes=2,
            num_decode_tokens=t,
            num_prefills=0,
            num_prefill_tokens=0,
            decode=uneven,
        ),
    }
    read_rows = [0, 6, 7, 8, 9, 10, 11]  # request 0's token, request 1's six tokens
    order = []

    def stub_forward(self, input_ids, positions, intermediate_tensors, *args):
        order.append("forward")
        if self.start_layer == 14:  # layer 20 writes its caches, its indexer the rows
            cos_sin = torch.randn(64, 64, generator=g)
            latent = torch.randn(t, 512, generator=g).to(torch.bfloat16)
            rope_quant_insert(latent, positions, cos_sin, ctx1[names[0]].kv_cache, slots, 1)
            k_pre = torch.randn(t, 128, generator=g).to(torch.bfloat16)
            weight = torch.ones(128, dtype=torch.bfloat16)
            indexer_k_norm_rope_store(
                k_pre, positions, cos_sin, weight, 1e-6, ctx1[names[1]].kv_cache, slots, 1, False
            )
            self.candidate_block_buffer[:12] = torch.randint(
                0, 99, (12, 64), generator=g, dtype=torch.int32
            )
            return IntermediateTensors(
                {
                    "hidden_states": torch.zeros(t, 4, 64, dtype=torch.bfloat16),
                    "pre_mix": torch.zeros(t, 4),
                }
            )
        return torch.zeros(t, 64)

    v41.DeepseekV4Model.forward = stub_forward
    install, pack = m2.install_relay, m1.pack_relay
    m2.install_relay = lambda *a: (order.append("install"), install(*a))[1]
    m1.pack_relay = lambda *a: (pack(*a), order.append("pack"))[0]
    m1.candidate_block_buffer.fill_(-3)
    m2.candidate_block_buffer.fill_(-9)
    with override_forward_context(create_forward_context(meta, vc1)):
        pp.rank_in_group, pp.is_first_rank, pp.is_last_rank = 1, False, False
        sent = m1(None, positions, IntermediateTensors({}))
    # What the runner hands the next stage: the payload rows copied into its buffers.
    received = IntermediateTensors({k: v.clone() for k, v in sent.tensors.items()})
    with override_forward_context(create_forward_context(meta, vc2)):
        pp.rank_in_group, pp.is_first_rank, pp.is_last_rank = 2, False, True
        m2(None, positions, received)
    result["forward_order"] = list(order)
    seq_lens = torch.tensor([3, 2, 1], dtype=torch.int32)  # slots 64..66, 130..131, 0
    table = torch.tensor([[1], [2], [0]], dtype=torch.int32)
    decoded = []
    for cache in (ctx1[names[0]].kv_cache, ctx2[names[0]].kv_cache):
        out_rows = torch.zeros(3, 4, 512, dtype=torch.bfloat16)
        dequantize_and_gather_k_cache(out_rows, cache, seq_lens, None, table, bs, 0)
        decoded.append(out_rows.view(torch.int16))
    same_ik = all(
        torch.equal(
            ctx1[names[1]].kv_cache[s // bs, s % bs], ctx2[names[1]].kv_cache[s // bs, s % bs]
        )
        for s in slots.tolist()
        if s >= 0
    )
    result["mirror_decodes_like_source"] = bool(torch.equal(*decoded)) and same_ik
    result["candidates_relayed"] = bool(
        torch.equal(m2.candidate_block_buffer[read_rows], m1.candidate_block_buffer[read_rows])
    )
    # A profile run (no attention metadata) still emits every key, zero-filled.
    with override_forward_context(create_forward_context(None, vc1)):
        pp.rank_in_group, pp.is_first_rank, pp.is_last_rank = 1, False, False
        profile = m1(None, positions, IntermediateTensors({}))
    result["profile_run_keys"] = sorted(profile.tensors)
    assert all(not v.any() for k, v in profile.tensors.items() if k.startswith("__"))

    # DSpark aux layers (design P4).
    pp.rank_in_group, pp.is_first_rank, pp.is_last_rank = 2, False, True
    m2._set_aux_hidden_state_layers((37, 38, 39))
    result["aux_ok"] = m2.supports_aux_hidden_states_over_pp is True
    try:
        m2._set_aux_hidden_state_layers((28, 38))
        result["aux_bad"] = "accepted"
    except ValueError as exc:
        result["aux_bad"] = str(exc)
    result["kv_planning"] = _kv_planning([vc for _, vc in models], config, pp)
    out.write_text(json.dumps(result))


def _kv_planning(stage_configs, config, pp) -> dict:
    """vLLM 0.33.0's own KV planning (the engine core's calls) over the three stages'
    specs, next to a PP=1 build of the same model: the global groups, whether stage 3
    declares layer 20's mirrors, and whether its KV tensors give them pages."""
    import os

    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        record_kv_cache_layout,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )
    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

    from deepinfer_sm80.vllm_plugin.pp_relay import relay

    def specs(vc):
        # On a CPU platform vLLM turns the hybrid KV cache manager off; on CUDA GPUs
        # (where this plan runs for real) it is on.
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        with set_current_vllm_config(vc):
            return get_kv_cache_spec(vc)

    def groups(vc, per_worker):
        with set_current_vllm_config(vc):
            found = get_global_kv_cache_groups(vc, per_worker)
        return [(sorted(g.layer_names), repr(g.kv_cache_spec)) for g in found], found

    def resolve_layout(configs, per_worker):
        # The engine core's step before grouping: one layout from what every worker's
        # attention backends support, recorded on every worker's config.
        names = []
        for vc in configs:
            with set_current_vllm_config(vc):
                backends = get_current_attn_backends(vc)
                names.append([lay.name for lay in get_supported_kv_cache_layouts(backends)])
        specs_all = [s for worker in per_worker for s in worker.values()]
        layout = resolve_kv_cache_layout(configs[0], names, specs_all)
        for vc in configs:
            record_kv_cache_layout(vc.cache_config, layout.name)
        return layout.name

    per_stage = [specs(vc) for vc in stage_configs]
    layout = resolve_layout(stage_configs, per_stage)
    pp_groups, global_groups = groups(stage_configs[0], per_stage)
    # The same model at PP=1 (relay inert: nothing crosses a stage).
    partition = os.environ.pop("VLLM_PP_LAYER_PARTITION")
    pp.world_size, pp.rank_in_group, pp.is_first_rank, pp.is_last_rank = 1, 0, True, True
    vc1 = config()
    with set_current_vllm_config(vc1):
        relay.PipelineRelayDeepseekV4Model(vllm_config=vc1, prefix="model")
    single_specs = [specs(vc1)]
    single_layout = resolve_layout([vc1], single_specs)
    single_groups, _ = groups(vc1, single_specs)
    pp.world_size = 3
    os.environ["VLLM_PP_LAYER_PARTITION"] = partition

    mirrors = ["model.layers.20.attn", "model.layers.20.attn.indexer.k_cache"]

    with set_current_vllm_config(stage_configs[0]):
        configs = get_kv_cache_configs(
            stage_configs[0], per_stage, [8 << 30] * len(per_stage), global_groups
        )
    return {
        "layouts": [layout, single_layout],
        "groups_equal_pp1": pp_groups == single_groups,
        "num_groups": len(pp_groups),
        "mirror_layers_on_stage3": [n for n in mirrors if n in per_stage[2]],
        "stage3_tensor_names": sorted(
            {n for t in configs[2].kv_cache_tensors for n in t.layers} & set(mirrors)
        ),
    }


# ---------------------------------------------------------------------------------------
# transport: a real payload between two processes over gloo


@pytest.mark.vllm
def test_payload_crosses_two_ranks_over_gloo_with_vllms_pp_send_recv(tmp_path):
    import_or_skip("vllm")
    got = _run_child("gloo", tmp_path)
    assert got == {
        "received_keys": [
            "__dsv41pp.candidates.20",
            "__dsv41pp.index_k.20",
            "__dsv41pp.kv.20",
            "hidden_states",
            "pre_mix",
        ],
        "mirror_equal": True,
        "rows_equal": True,
    }


def _gloo_source(seed: int):
    g = torch.Generator().manual_seed(seed)
    src = paged(4, 16, 584, pad=8640)
    raw = src.as_strided((4 * src.stride(0),), (1,))
    raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))
    ik = paged(4, 16, 132, pad=100)
    raw = ik.as_strided((4 * ik.stride(0),), (1,))
    raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))
    cand = torch.randint(0, 1000, (10, 64), generator=g, dtype=torch.int32)
    slots = torch.tensor([5, 6, -1, 40, 63, 17], dtype=torch.int64)
    return src, ik, cand, slots


def _gloo_rank(rank: int, port: int, out: str) -> None:
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import (
        get_pp_group,
        init_distributed_environment,
        initialize_model_parallel,
    )

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        init_distributed_environment(
            world_size=2,
            rank=rank,
            local_rank=rank,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            backend="gloo",
        )
        initialize_model_parallel(1, 2)
    src, ik, cand, slots = _gloo_source(7)
    rows = 8
    if rank == 0:
        payload = {
            "hidden_states": torch.randn(rows, 4, 64).to(torch.bfloat16),
            "pre_mix": torch.randn(rows, 4),
        }
        for key, cache in (("__dsv41pp.kv.20", src), ("__dsv41pp.index_k.20", ik)):
            payload[key] = torch.empty(rows, cache.shape[-1], dtype=torch.uint8)
            records.pack_records(cache, slots, payload[key])
        payload["__dsv41pp.candidates.20"] = torch.empty(rows, 64, dtype=torch.int32)
        records.pack_rows(cand, payload["__dsv41pp.candidates.20"])
        get_pp_group().send_tensor_dict(payload)
        return
    received = get_pp_group().recv_tensor_dict()
    mirror, mirror_ik = paged(4, 16, 584, pad=0), paged(4, 16, 132, pad=0)
    records.unpack_records(received["__dsv41pp.kv.20"], slots, mirror)
    records.unpack_records(received["__dsv41pp.index_k.20"], slots, mirror_ik)
    rows_buf = torch.zeros(10, 64, dtype=torch.int32)
    records.unpack_rows(received["__dsv41pp.candidates.20"], rows_buf)
    valid = [s for s in slots.tolist() if s >= 0]
    result = {
        "received_keys": sorted(received),
        "mirror_equal": all(
            torch.equal(record_ref(mirror, s), record_ref(src, s))
            and torch.equal(record_ref(mirror_ik, s), record_ref(ik, s))
            for s in valid
        ),
        "rows_equal": bool(torch.equal(rows_buf[:rows], cand[:rows])),
    }
    Path(out).write_text(json.dumps(result))


def _child_gloo(tmp: Path, out: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    procs = [
        subprocess.Popen([PY, __file__, "gloo-rank", str(r), str(port), str(out)], env=env)
        for r in (0, 1)
    ]
    codes = [p.wait(timeout=400) for p in procs]
    if codes != [0, 0]:
        raise SystemExit(f"gloo ranks exited with {codes}")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "construct":
        _child_construct(Path(sys.argv[2]), Path(sys.argv[3]))
    elif mode == "gloo":
        _child_gloo(Path(sys.argv[2]), Path(sys.argv[3]))
    elif mode == "gloo-rank":
        _gloo_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
