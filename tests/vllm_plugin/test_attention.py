"""The Ampere attention layer (vllm_plugin/attention.py) against the real vLLM 0.33.0, on CPU.

What runs here (TRITON_INTERPRET=1, CUDA_VISIBLE_DEVICES= set and empty):
- the selection: ``select_dsv4_attn_cls`` answers our layer when the platform reports 8.x
  (the capability is mocked) and exactly vLLM's answer otherwise; its signature is vLLM's;
  the ledger entry resolves and applies;
- the compute-capability check of our backend accepts 8.0/8.6 (vLLM's refuses them);
- the SWA metadata builder our layer declares (vLLM's builder, run for real on CPU) builds
  no FlashMLA tile scheduler (``get_mla_metadata`` is never called; vLLM's builder does
  call it, so the check can fail);
- the layer's ``_forward_decode`` and ``_forward_prefill``, called directly, and its
  inherited ``forward_mqa`` on a mixed batch (after the warm-up run has reserved the
  workspace and the workspace is locked), on real ``DeepseekSparseSWAMetadata`` (from the
  builder) and ``DeepseekV4FlashMLAMetadata``: the real heads equal the PyTorch reference
  (``ops/sparse_mla/ref.py``, attention over exactly the records FlashMLA would read,
  indices derived here from positions, not from the code under test) within the error
  budget of ``tools/compare.py`` (per element and in norm, set by PyTorch-in-bf16's
  error); padded heads stay NaN (unwritten: nothing in vLLM reads them).

The layer object is vLLM's class made with ``__new__`` and given the attributes vLLM's
``__init__`` sets and these methods read (building it for real needs a model config, TP
groups and weights). Caches are laid out as vLLM allocates them (576-aligned pages).

What cannot run without a GPU: the layer built by vLLM inside a real model and its full
forward (Q/KV preparation, o_proj on SM80), CUDA-graph capture and replay of the decode
with our kernels (FULL graphs under DSpark), vLLM's GPU-side cache allocation, PCP, and
production shapes (64 heads, window 128, Top-K 512), which ``test_production_shapes``
(marked gpu) covers on ``make test-gpu``.
"""

from __future__ import annotations

import dataclasses
import inspect
import types

import pytest
import torch

from deepinfer_sm80.ops.kv_cache.ref import insert_ref
from deepinfer_sm80.ops.sparse_mla.ref import sparse_mla_decode_ref
from tools.compare import assert_within_torch_budget
from tools.poison import move_cache, nan_empty, paged_cache
from tools.tiers import import_or_skip

from ..ops.test_sparse_mla import _queries, _realistic_k

pytestmark = pytest.mark.vllm
vllm = import_or_skip("vllm")

from vllm.config import AttentionConfig, DeviceConfig, ParallelConfig, VllmConfig  # noqa: E402
from vllm.forward_context import create_forward_context, override_forward_context  # noqa: E402
from vllm.model_executor.model_loader.weight_utils import make_attention_sink  # noqa: E402
from vllm.models.deepseek_v41.nvidia import model as v41_model  # noqa: E402
from vllm.models.deepseek_v41.nvidia.flashmla import (  # noqa: E402
    DeepseekSparseSWAFlashMLAMetadataBuilder,
    DeepseekV4FlashMLAAttention,
)
from vllm.models.deepseek_v41.sparse_mla import (  # noqa: E402
    DeepseekV4FlashMLABackend,
    DeepseekV4FlashMLAMetadata,
)
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.mla import sparse_swa  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.kv_cache_interface import SlidingWindowMLASpec  # noqa: E402
from vllm.v1.worker import workspace  # noqa: E402

from deepinfer_sm80.vllm_plugin import apply, ledger  # noqa: E402
from deepinfer_sm80.vllm_plugin import attention as ampere  # noqa: E402

Ours = ampere.DeepseekV4AmpereSparseMLAAttention
SCALE = 512**-0.5
SWA_PREFIX = "model.layers.3.attn.swa_cache"
MLA_PREFIX = "model.layers.2.attn"
SELECT_TARGET = "vllm.models.deepseek_v41.nvidia.model:_select_dsv4_attn_cls"


# ---------------------------------------------------------------- selection and capability


@pytest.fixture
def capability(monkeypatch):
    """Make the platform report a compute capability (None = no GPU)."""
    platform = v41_model.current_platform

    def set_capability(cap):
        value = None if cap is None else DeviceCapability(*cap)
        monkeypatch.setattr(platform, "get_device_capability", lambda device_id=0: value)

    return set_capability


def _config(backend=None, pcp: int = 1) -> VllmConfig:
    return VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        attention_config=AttentionConfig(backend=backend),
        parallel_config=ParallelConfig(prefill_context_parallel_size=pcp),
    )


def test_selection_signature_is_vllms():
    ours = inspect.signature(ampere.select_dsv4_attn_cls).parameters
    theirs = inspect.signature(ampere._vllm_select_dsv4_attn_cls).parameters
    assert [(p.name, p.default) for p in ours.values()] == [
        (p.name, p.default) for p in theirs.values()
    ]
    assert ampere._vllm_select_dsv4_attn_cls.__module__ == v41_model.__name__


@pytest.mark.parametrize("cap", [(8, 0), (8, 6)], ids=["sm80", "sm86"])
@pytest.mark.parametrize(
    "backend,pcp",
    [(None, 1), (AttentionBackendEnum.FLASHMLA_SPARSE_DSV41, 1), (None, 2)],
    ids=["auto", "flashmla", "pcp2"],
)
def test_selection_on_sm8x_is_ours(capability, cap, backend, pcp):
    capability(cap)
    config = _config(backend, pcp)
    assert ampere._vllm_select_dsv4_attn_cls(config) is DeepseekV4FlashMLAAttention
    assert ampere.select_dsv4_attn_cls(config) is Ours


@pytest.mark.parametrize(
    "backend",
    [
        AttentionBackendEnum.FLASHINFER_MLA_SPARSE_DSV41,
        AttentionBackendEnum.FLASHMLA_MEGA_ATTN_DSV41,
    ],
    ids=["flashinfer", "mega"],
)
def test_explicit_other_backend_on_sm8x_is_left_to_vllm(capability, backend):
    capability((8, 0))
    config = _config(backend)
    assert ampere.select_dsv4_attn_cls(config) is ampere._vllm_select_dsv4_attn_cls(config)
    assert ampere.select_dsv4_attn_cls(config) is not Ours


@pytest.mark.parametrize("cap", [(9, 0), (10, 0), (12, 0), (7, 5), None])
def test_selection_elsewhere_is_vllms(capability, cap, monkeypatch):
    monkeypatch.delenv("DEEPINFER_FORCE", raising=False)
    capability(cap)
    config = _config()
    chosen = ampere.select_dsv4_attn_cls(config)
    assert chosen is ampere._vllm_select_dsv4_attn_cls(config)
    assert chosen is not Ours


def test_force_flag_selects_ours_on_other_gpus(capability, monkeypatch):
    """DEEPINFER_FORCE=1: the Ampere layer on an H200 too (how the GPU tests run it)."""
    capability((9, 0))
    monkeypatch.setenv("DEEPINFER_FORCE", "1")
    assert ampere.select_dsv4_attn_cls(_config()) is Ours


def test_capability_check_accepts_sm8x():
    backend = Ours.backend_cls  # what the layer's get_attn_backend() hands vLLM
    assert backend is ampere.DeepseekV4AmpereSparseMLABackend
    for cap, ok in [((8, 0), True), ((8, 6), True), ((9, 0), True), ((10, 0), True)]:
        assert backend.supports_compute_capability(DeviceCapability(*cap)) is ok
    assert not backend.supports_compute_capability(DeviceCapability(7, 5))
    # vLLM's refuses sm8x: why ours exists.
    assert not DeepseekV4FlashMLABackend.supports_compute_capability(DeviceCapability(8, 0))
    reasons = backend.validate_configuration(
        head_size=512, dtype=torch.bfloat16, kv_cache_dtype="fp8_ds_mla", block_size=128,
        use_mla=True, has_sink=True, use_sparse=True, use_mm_prefix=False,
        use_per_head_quant_scales=False, device_capability=DeviceCapability(8, 0),
        attn_type="decoder",
    )  # fmt: skip
    assert "compute capability not supported" not in reasons, reasons
    # Everything else is FLASHMLA_SPARSE_DSV41's: name, builder, block sizes.
    assert backend.get_name() == DeepseekV4FlashMLABackend.get_name() == "FLASHMLA_SPARSE_DSV41"
    assert backend.get_builder_cls() is DeepseekV4FlashMLABackend.get_builder_cls()
    assert backend.get_supported_kernel_block_sizes() == [128]


def test_layer_is_vllms_flashmla_layer_with_our_backends():
    assert issubclass(Ours, DeepseekV4FlashMLAAttention)
    assert Ours.forward_mqa is DeepseekV4FlashMLAAttention.forward_mqa
    assert Ours._o_proj is DeepseekV4FlashMLAAttention._o_proj
    assert Ours.get_padded_num_q_heads(16) == 64
    assert Ours.swa_backend_cls.get_builder_cls() is ampere.AmpereSparseSWAMetadataBuilder
    for name in ("_forward_decode", "_forward_prefill"):
        assert list(inspect.signature(getattr(Ours, name)).parameters) == list(
            inspect.signature(getattr(DeepseekV4FlashMLAAttention, name)).parameters
        )


@pytest.fixture
def restore_selector():
    saved = v41_model._select_dsv4_attn_cls
    yield
    v41_model._select_dsv4_attn_cls = saved


def test_ledger_entry_rebinds_the_selector(restore_selector, tmp_path):
    entry = next(e for e in ledger.LEDGER if e.name == "attention")
    assert entry.targets == (SELECT_TARGET,)
    apply.plan_patches([entry])  # resolves and checks the signature
    status = apply.activate(
        {
            "DEEPINFER_FORCE": "1",
            "DEEPINFER_PATCHES": "attention",
            "DEEPINFER_RUNTIME_DIR": str(tmp_path),
        },
        capabilities=[],
    )
    assert status["patches"]["attention"] == "applied: 1 sites"
    assert v41_model._select_dsv4_attn_cls is ampere.select_dsv4_attn_cls


# ---------------------------------------------------------------- a batch, as vLLM builds it


@dataclasses.dataclass(frozen=True)
class Shapes:
    heads: int = 16  # n_local_heads (TP4); padded to 64
    window: int = 32
    topk: int = 64
    swa_block: int = 32  # vLLM's SWA cache block
    kv_block: int = 32  # compressed cache block in tokens (vLLM: 128 on sm8x)
    max_model_len: int = 64
    max_tokens: int = 32  # max_num_batched_tokens


SMALL = Shapes()
# Decodes (context lengths, one new token each), then prefills (context, query length).
DECODES = (40, 1, 61)
PREFILLS = ((20, 5), (0, 7), (50, 3))


@dataclasses.dataclass
class Batch:
    shapes: Shapes
    ratio: int
    layer: object
    swa_md: object
    mla_md: object
    q: torch.Tensor
    positions: torch.Tensor
    swa_cache: torch.Tensor
    comp_cache: torch.Tensor | None
    token_req: list[int]
    swa_table: torch.Tensor
    comp_table: torch.Tensor
    num_decode_tokens: int

    def reference(self, precision: str) -> torch.Tensor:
        """Attention over the records FlashMLA reads, from positions: SWA rows
        ``[max(0, p - window + 1), p]``; compressed rows = the token's Top-K entries,
        the first ``min((p + 1) // ratio, topk)`` of them for a prefill token and those
        before the first -1 for a decode token (vLLM's ``topk_lens`` count)."""
        s, r = self.shapes, self.ratio
        topk_rows = self.layer.topk_indices_buffer.cpu()
        positions = self.positions.cpu().tolist()
        swa_idx, swa_len, comp_idx, comp_len = [], [], [], []
        for t, (req, p) in enumerate(zip(self.token_req, positions, strict=True)):
            lo = max(0, p - s.window + 1)
            pos = torch.arange(lo, p + 1)
            swa_idx.append(
                self.swa_table[req, pos // s.swa_block] * s.swa_block + pos % s.swa_block
            )
            swa_len.append(len(pos))
            if r:
                row = topk_rows[t]
                decode = t < self.num_decode_tokens
                n = int((row >= 0).sum()) if decode else min((p + 1) // r, s.topk)
                chosen = row[:n][row[:n] >= 0].long()
                cbs = s.kv_block // r
                comp_idx.append(self.comp_table[req, chosen // cbs] * cbs + chosen % cbs)
                comp_len.append(len(chosen))

        def padded(rows, width):
            out = torch.full((len(rows), width), -1, dtype=torch.int32)
            for i, row in enumerate(rows):
                out[i, : len(row)] = row
            return out

        as_len = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
        out, _ = sparse_mla_decode_ref(
            self.q.cpu(),
            move_cache(self.swa_cache, "cpu"),
            padded(swa_idx, s.window),
            as_len(swa_len),
            SCALE,
            self.layer.attn_sink.detach().cpu(),
            move_cache(self.comp_cache, "cpu") if r else None,
            padded(comp_idx, s.topk) if r else None,
            as_len(comp_len) if r else None,
            num_heads=s.heads,
            precision=precision,
        )
        return out


def _table(num_reqs: int, blocks_per_req: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
    """Shuffled, distinct page ids, plus spare pages nobody owns (left 0xFF = NaN)."""
    num_blocks = num_reqs * blocks_per_req + 3
    ids = torch.randperm(num_blocks, generator=g)[: num_reqs * blocks_per_req]
    return ids.view(num_reqs, blocks_per_req).int(), num_blocks


def _swa_builder_config(s: Shapes, ratio: int):
    """The fields vLLM's SWA metadata builders read from the VllmConfig."""
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(
            max_model_len=s.max_model_len,
            hf_config=types.SimpleNamespace(sliding_window=s.window, compress_ratios=[ratio]),
        ),
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=s.max_tokens, max_num_seqs=8),
        speculative_config=None,
        parallel_config=types.SimpleNamespace(prefill_context_parallel_size=1),
    )


def make_batch(s: Shapes, ratio: int, decodes, prefills, *, seed: int, device, chunk_size=1):
    g = torch.Generator().manual_seed(seed)
    reqs = [(ctx, 1) for ctx in decodes] + list(prefills)
    seq_lens = [ctx + n for ctx, n in reqs]
    assert max(seq_lens) <= s.max_model_len and sum(n for _, n in reqs) <= s.max_tokens
    R = len(reqs)

    # SWA cache: every position of every request written (as earlier steps and this
    # step's insert would have).
    swa_table, swa_blocks = _table(R, -(-s.max_model_len // s.swa_block), g)
    swa_cache = paged_cache(swa_blocks, s.swa_block, device=device)
    all_rows = []
    for req, S in enumerate(seq_lens):
        pos = torch.arange(S)
        slots = swa_table[req, pos // s.swa_block] * s.swa_block + pos % s.swa_block
        rows = _realistic_k(S, g)
        insert_ref(rows.to(device), swa_cache, slots.to(device), s.swa_block)
        all_rows.append(rows)

    # Compressed cache: positions [0, seq_len // ratio) written.
    comp_cache = None
    cbs = s.kv_block // max(ratio, 1)
    comp_table, comp_blocks = _table(R, -(-s.max_model_len // s.kv_block), g)
    if ratio:
        comp_cache = paged_cache(comp_blocks, cbs, device=device)
        for req, S in enumerate(seq_lens):
            pos = torch.arange(S // ratio)
            slots = comp_table[req, pos // cbs] * cbs + pos % cbs
            rows = _realistic_k(len(pos), g)
            insert_ref(rows.to(device), comp_cache, slots.to(device), cbs)
            all_rows.append(rows)

    # Tokens, and the shared Top-K buffer the index source fills (local positions).
    token_req, positions, slot_mapping = [], [], []
    topk_buffer = torch.randint(0, 1 << 20, (s.max_tokens, s.topk), generator=g).int()
    for req, ((ctx, _), S) in enumerate(zip(reqs, seq_lens, strict=True)):
        for p in range(ctx, S):
            t = len(positions)
            token_req.append(req)
            positions.append(p)
            slot_mapping.append(
                int(swa_table[req, p // s.swa_block]) * s.swa_block + p % s.swa_block
            )
            if not ratio:
                continue
            if req < len(decodes):  # indexer output: valid positions, then -1
                k = min(S // ratio, s.topk)
                topk_buffer[t] = -1
                topk_buffer[t, :k] = torch.randperm(S // ratio, generator=g)[:k].int()
            else:  # counted prefix with -1 holes; past it, valid-looking garbage
                k = min((p + 1) // ratio, s.topk)
                row = torch.randint(0, max(S // ratio, 1), (s.topk,), generator=g).int()
                row[:k] = torch.randperm((p + 1) // ratio, generator=g)[:k].int()
                row[:k][torch.rand(k, generator=g) < 0.1] = -1
                topk_buffer[t] = row
    T = len(positions)
    num_decode_tokens = len(decodes)

    # Real metadata: SWA from our builder (vLLM's, minus the tile scheduler).
    starts = torch.tensor([0] + [n for _, n in reqs], dtype=torch.int32).cumsum(0).int()
    spec = SlidingWindowMLASpec(
        block_size=s.swa_block, num_kv_heads=1, head_size=512, dtype=torch.uint8,
        sliding_window=s.window, cache_dtype_str="fp8_ds_mla",
    )  # fmt: skip
    builder = ampere.AmpereSparseSWAMetadataBuilder(
        spec, [SWA_PREFIX], _swa_builder_config(s, ratio), torch.device(device)
    )
    common = CommonAttentionMetadata(
        query_start_loc=starts.to(device),
        query_start_loc_cpu=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        num_reqs=R,
        num_actual_tokens=T,
        max_query_len=max(n for _, n in reqs),
        max_seq_len=max(seq_lens),
        block_table_tensor=swa_table.to(device),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, device=device),
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
    )
    swa_md = builder.build(0, common)
    assert (swa_md.num_decode_tokens, swa_md.num_prefills) == (num_decode_tokens, len(prefills))
    mla_md = DeepseekV4FlashMLAMetadata(
        num_reqs=R,
        max_query_len=common.max_query_len,
        max_seq_len=common.max_seq_len,
        num_actual_tokens=T,
        query_start_loc=common.query_start_loc,
        slot_mapping=torch.full((T,), -1, dtype=torch.int64, device=device),  # insert only
        block_table=comp_table.to(device),
        req_id_per_token=swa_md.token_to_req_indices,
        block_size=s.kv_block,
        topk_tokens=s.topk,
    )

    # q as vLLM's fused insert hands it over: real heads, then zero padding heads.
    padded = Ours.get_padded_num_q_heads(s.heads)
    q = torch.zeros(T, padded, 512, dtype=torch.bfloat16)
    q[:, : s.heads] = _queries(T, s.heads, torch.cat(all_rows), g)
    sink = make_attention_sink(padded, torch.float32)  # -inf padding, like vLLM's
    sink.data[: s.heads] = torch.randn(s.heads, generator=g) * 2 + 4

    layer = make_layer(s, ratio, swa_cache, comp_cache, topk_buffer.to(device), sink, chunk_size)
    layer.to(device)
    return Batch(
        s, ratio, layer, swa_md, mla_md if ratio else None, q.to(device),
        torch.tensor(positions, dtype=torch.int64, device=device), swa_cache, comp_cache,
        token_req, swa_table, comp_table, num_decode_tokens,
    )  # fmt: skip


def make_layer(s: Shapes, ratio, swa_cache, comp_cache, topk_buffer, sink, chunk_size):
    """Our layer class with the attributes vLLM's __init__ sets and the forward reads."""
    layer = Ours.__new__(Ours)
    torch.nn.Module.__init__(layer)
    layer.n_local_heads = s.heads
    layer.padded_heads = Ours.get_padded_num_q_heads(s.heads)
    layer.compress_ratio = ratio
    layer.scale = SCALE
    layer.attn_sink = sink
    layer.window_size = s.window
    layer.max_model_len = s.max_model_len
    layer.max_num_batched_tokens = s.max_tokens
    layer.topk_indices_buffer = topk_buffer
    layer.PREFILL_CHUNK_SIZE = chunk_size  # 1 here: the chunk plan then has two chunks
    layer.use_pcp = False
    layer.swa_cache_layer = types.SimpleNamespace(kv_cache=swa_cache, prefix=SWA_PREFIX)
    layer.is_kv_source = ratio > 0
    layer.compressed_cache_prefix = MLA_PREFIX if ratio else None
    layer.kv_cache = comp_cache
    layer._prefill_num_heads = layer._get_prefill_num_heads()
    return layer


@pytest.fixture
def workspace_manager(device):
    workspace.init_workspace_manager(torch.device(device))
    yield workspace.current_workspace_manager()
    workspace.reset_workspace_manager()


def _check(name: str, b: Batch, got: torch.Tensor) -> None:
    h = b.shapes.heads
    ref, torch_bf16 = b.reference("fp64"), b.reference("bf16")
    assert_within_torch_budget(name, got[:, :h].float().cpu(), ref[:, :h], torch_bf16[:, :h])
    # Padded heads get no work: their rows keep the poison.
    assert torch.isnan(got[:, h:].float()).all(), f"{name}: a padded head was written"


# ---------------------------------------------------------------- the forward methods


@pytest.mark.parametrize("ratio", [0, 1, 2], ids=["swa-only", "ratio1", "ratio2"])
def test_decode_matches_reference(device, ratio):
    b = make_batch(SMALL, ratio, DECODES, (), seed=10 + ratio, device=device)
    assert b.swa_md.tile_sched_c1a is None and b.swa_md.tile_sched_swaonly is None
    out = nan_empty(*b.q.shape, device=device)
    b.layer._forward_decode(
        q=b.q,
        kv_cache=b.comp_cache,
        swa_metadata=b.swa_md,
        attn_metadata=b.mla_md,
        swa_only=ratio == 0,
        output=out,
    )
    _check(f"decode ratio {ratio}", b, out)


@pytest.mark.parametrize("ratio", [0, 2], ids=["swa-only", "ratio2"])
def test_prefill_matches_reference(device, workspace_manager, ratio):
    b = make_batch(SMALL, ratio, (), PREFILLS, seed=20 + ratio, device=device)
    plan = b.swa_md.get_prefill_chunk_plan(ratio, 1, has_compressed=ratio > 0)
    assert len(plan) == 2 and plan[0][:2] == (0, 2)  # two chunks, the first of two requests
    out = nan_empty(*b.q.shape, device=device)
    b.layer._forward_prefill(
        q=b.q,
        positions=b.positions,
        compressed_k_cache=b.comp_cache,
        swa_k_cache=b.swa_cache,
        output=out,
        attn_metadata=b.mla_md,
        swa_metadata=b.swa_md,
    )
    _check(f"prefill ratio {ratio}", b, out)


def test_mixed_batch_through_forward_mqa_fits_the_warmup_workspace(device, workspace_manager):
    """vLLM's forward_mqa (inherited) splits decodes and prefills and calls our methods;
    the prefill fits in what the warm-up run reserved, with the workspace locked."""
    b = make_batch(SMALL, 1, DECODES, PREFILLS, seed=30, device=device)
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    out = nan_empty(*b.q.shape, device=device)
    with override_forward_context(create_forward_context(None, config)):
        b.layer.forward_mqa(b.q, torch.empty(0), b.positions, out)  # warm-up (dummy) run
    assert (out == 0).all()
    workspace_manager.lock()
    out.fill_(float("nan"))
    metadata = {SWA_PREFIX: b.swa_md, MLA_PREFIX: b.mla_md}
    with override_forward_context(create_forward_context(metadata, config)):
        b.layer.forward_mqa(b.q, torch.empty(0), b.positions, out)
    _check("mixed batch ratio 1", b, out)


def test_swa_builder_builds_no_tile_scheduler(monkeypatch):
    """Ours never asks FlashMLA for a plan; vLLM's builder does (so this can fail)."""
    calls = []

    def get_mla_metadata(*args, **kwargs):
        calls.append(args)
        return object(), None

    monkeypatch.setattr(sparse_swa, "get_mla_metadata", get_mla_metadata)
    b = make_batch(SMALL, 2, DECODES[:1], PREFILLS[:1], seed=40, device="cpu")
    md = b.swa_md
    assert md.num_decode_tokens == 1
    for layer_type in ampere.TILE_SCHEDULER_LAYER_TYPES:
        assert getattr(md, f"tile_sched_{layer_type}") is None
    assert ampere.AmpereSparseSWAMetadataBuilder.build_tile_scheduler(None, 5) == dict.fromkeys(
        ampere.TILE_SCHEDULER_LAYER_TYPES
    )
    assert calls == []
    # vLLM's FlashMLA SWA builder on the same batch plans for every layer type present.
    theirs = DeepseekSparseSWAFlashMLAMetadataBuilder(
        SlidingWindowMLASpec(
            block_size=32, num_kv_heads=1, head_size=512, dtype=torch.uint8,
            sliding_window=32, cache_dtype_str="fp8_ds_mla",
        ),
        [SWA_PREFIX], _swa_builder_config(SMALL, 2), torch.device("cpu"),
    )  # fmt: skip
    theirs.build_tile_scheduler(1)
    assert len(calls) == 1


# ---------------------------------------------------------------- GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 8], ids=["TP1", "TP8"])
@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_production_shapes(device, workspace_manager, heads, ratio):
    """Window 128, Top-K 512, 128-token compressed pages, mixed batch through forward_mqa."""
    s = Shapes(heads=heads, window=128, topk=512, kv_block=128, max_model_len=4096, max_tokens=512)
    b = make_batch(
        s, ratio, (4000, 1, 777), ((1000, 300), (0, 129), (3000, 64)), seed=50, device=device,
        chunk_size=4,
    )  # fmt: skip
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    out = nan_empty(*b.q.shape, device=device)
    with override_forward_context(create_forward_context(None, config)):
        b.layer.forward_mqa(b.q, torch.empty(0), b.positions, out)
    workspace_manager.lock()
    out.fill_(float("nan"))
    metadata = {SWA_PREFIX: b.swa_md, MLA_PREFIX: b.mla_md}
    with override_forward_context(create_forward_context(metadata, config)):
        b.layer.forward_mqa(b.q, torch.empty(0), b.positions, out)
    _check(f"production H{heads} ratio {ratio}", b, out)
