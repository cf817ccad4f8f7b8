"""ops/engram: the Engram FP8 table lookup, bit-exact against ref.py and vLLM's own kernel.

vLLM 0.33.0's ``_engram_lookup_kernel`` runs on CPU under the interpreter (conftest), so
it is the oracle for every mode (bf16 rows, packed bytes, table-order sort, peer
buffers). One interpreter gap: it decodes the e4m3fn NaN codes 0x7F/0xFF as +-480 where
the GPU gives NaN, so comparisons with it use tables without those two codes, and the
NaN codes are checked against ref.py (torch's decode, the GPU's). The interpreter also
rounds fp32 denormals to bf16 unlike torch, so comparisons with ref.py keep products
normal (scale bytes >= 10, or 0 / 255); the ``gpu`` cases cover the full byte range.
"""

import inspect
import os
from types import SimpleNamespace

import pytest
import torch

from deepinfer_sm80.ampere_fit import (
    compile_for_ampere,
    format_reports,
)
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops.engram import engram_lookup_kernel_override
from deepinfer_sm80.ops.engram.ref import (
    dequantize_rows_ref,
    head_lookup_ref,
    peer_table_ref,
    sorted_lookup_ref,
)
from tools.poison import nan_empty

if os.environ.get("DEEPINFER_REQUIRE_VLLM") == "1":
    import vllm.models.deepseek_v41.common.engram as vllm_engram
else:
    vllm_engram = pytest.importorskip("vllm.models.deepseek_v41.common.engram")

ENGRAM = "vllm.models.deepseek_v41.common.engram"
KERNEL_NAME = f"{ENGRAM}._engram_lookup_kernel"
DIM, QB, HEADS, BLOCK_R = 256, 32, 24, 16

# DeepSeek-V4.1-Flash config.json, Engram keys (vLLM ships no config; see the shared doc).
V41_ENGRAM = SimpleNamespace(
    engram_layer_ids=[1, 14],
    engram_num_embeddings=[384006168, 384016682],
    engram_max_ngram_size=4,
    engram_vocab_size=16000000,
    engram_n_heads=8,
    engram_head_dim=256,
    engram_pad_token_id=2,
    engram_compressed_vocab_size=99092,
)


# ------------------------------------------------------------------ helpers


def _table(rows: int, seed: int, nan_codes: bool = True, min_scale: int = 10, device="cpu"):
    """A shard table: row 0 holds all 256 e4m3 bytes in order, the rest random bytes
    (without 0x7F/0xFF unless ``nan_codes``); scale bytes random in [min_scale, 254],
    plus one row with scale byte 0 and one with 255 (the bit-shift decode's ends)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 256, (rows, DIM), generator=g, dtype=torch.uint8)
    values[0] = torch.arange(256, dtype=torch.uint8)
    if not nan_codes:
        values = torch.where((values & 0x7F) == 0x7F, values ^ 0x01, values)
    scales = torch.randint(min_scale, 255, (rows, DIM // QB), generator=g, dtype=torch.uint8)
    if rows > 2:
        scales[1] = 0
        scales[2] = 255
    return values.view(torch.float8_e4m3fn).to(device), scales.to(device)


def _ids(num_tokens: int, vocab_start: int, vocab_end: int, seed: int, device="cpu"):
    """[T, 24] int32 ids: mostly owned, plus -1 (DEAD_ID), ids just outside the shard on
    both sides, ids far outside (other shards' buckets) and the two boundary rows."""
    g = torch.Generator().manual_seed(seed)
    span = vocab_end - vocab_start
    ids = vocab_start + torch.randint(0, span, (num_tokens, HEADS), generator=g)
    pick = torch.randint(0, 8, ids.shape, generator=g)
    ids = torch.where(pick == 0, torch.full_like(ids, -1), ids)
    ids = torch.where(pick == 1, ids - span, ids)  # below the shard (maybe negative)
    ids = torch.where(pick == 2, ids + span, ids)  # above the shard
    ids = torch.where(pick == 3, torch.full_like(ids, vocab_start), ids)
    ids = torch.where(pick == 4, torch.full_like(ids, vocab_end - 1), ids)
    ids = torch.where(pick == 5, torch.full_like(ids, vocab_end), ids)
    ids[0, :] = vocab_start  # row 0: every e4m3 code
    return ids.to(torch.int32).to(device)


def _launch(
    kernel,
    weight,
    scales,
    ids,
    out,
    vocab_start,
    vocab_end,
    head_start,
    local_heads,
    grid,
    *,
    sorted_dst=None,
    num_rows=None,
    packed=False,
    peer_rows=0,
):
    """Call ``kernel`` exactly as ``ParallelEngramEmbedding.lookup`` launches it."""
    sorted_ = sorted_dst is not None
    if num_rows is None:
        num_rows = ids.numel() if sorted_ else ids.shape[0] * local_heads
    ids_stride_t, ids_stride_h = (0, 0) if sorted_ else ids.stride()
    kernel(
        weight,
        scales,
        ids,
        sorted_dst if sorted_ else ids,
        out,
        vocab_start,
        vocab_end,
        num_rows,
        ids_stride_t,
        ids_stride_h,
        HEAD_START=head_start,
        LOCAL_HEADS=local_heads,
        TOTAL_HEADS=HEADS,
        DIM=DIM,
        QUANT_BLOCK=QB,
        BLOCK_R=BLOCK_R,
        GRID=grid,
        SORTED=sorted_,
        PACKED=packed,
        OUT_STRIDE=out.stride(0),
        PEER_ROWS=peer_rows,
    )


def _vllm(grid):
    return vllm_engram._engram_lookup_kernel[(grid,)]


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype == torch.bfloat16:
        same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
    else:
        same = got == want
    bad = (~same).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.shape[0]} of {got.numel()} elements differ, first at "
        f"{bad[0].tolist()}: got {got[tuple(bad[0])].item()}, want {want[tuple(bad[0])].item()}"
    )


def _shard(head_start: int, local_heads: int, sizes: list[int]) -> tuple[int, int]:
    """vLLM's shard row range: the buckets of heads [head_start, head_start + local)."""
    return sum(sizes[:head_start]), sum(sizes[: head_start + local_heads])


# ------------------------------------------------------------------ contract


def test_signature_equals_vllm_kernel():
    """Same parameter names, order, kinds and defaults as vLLM's kernel, so
    register_kernels forwards launches by name (KernelOverride._forward_by_name)."""
    kernel = vllm_engram._engram_lookup_kernel
    ours = inspect.signature(engram_lookup_kernel_override).parameters.values()
    theirs = inspect.signature(kernel.fn).parameters.values()
    assert [(p.name, p.kind, p.default) for p in ours] == [
        (p.name, p.kind, p.default) for p in theirs
    ]
    assert tuple(p.name for p in ours) == tuple(kernel.arg_names)


def test_v41_config_dims():
    """The V4.1 Engram geometry the specs and shapes below assume: 24 prime buckets per
    layer summing to engram_num_embeddings, 256-dim rows."""
    layout = vllm_engram.EngramLayout(V41_ENGRAM)
    assert layout.n_hash_cols == HEADS and layout.head_dim == DIM
    for layer, total in enumerate(V41_ENGRAM.engram_num_embeddings):
        sizes = [p for order in layout.primes[layer] for p in order]
        assert len(sizes) == HEADS and sum(sizes) == total
        assert all(16_000_000 < p < 16_001_000 for p in sizes)


def test_dequantize_ref_op_order():
    """ref: decode e4m3 to fp32, times 2**(s-127) in fp32, one bf16 rounding."""
    values = torch.arange(256, dtype=torch.uint8).view(1, DIM)
    for s in (0, 10, 120, 127, 134, 254, 255):
        scales = torch.full((1, DIM // QB), s, dtype=torch.uint8)
        got = dequantize_rows_ref(values, scales)
        scale = 0.0 if s == 0 else float("inf") if s == 255 else 2.0 ** (s - 127)
        want = (values.view(torch.float8_e4m3fn).float() * scale).to(torch.bfloat16)
        _assert_same_bits(got, want, f"scale byte {s}")
    assert dequantize_rows_ref(values, torch.full((1, 8), 127, dtype=torch.uint8))[0, 0x7F].isnan()


# ------------------------------------------------------------------ bf16 rows


@pytest.mark.parametrize(
    "num_tokens,local_heads,head_start,grid",
    [
        (1, 24, 0, 1),  # TP1, one token
        (7, 12, 12, 3),  # TP2 rank 1, odd tokens, grid < tiles
        (37, 6, 18, 5),  # TP4 rank 3
        (13, 5, 20, 64),  # 5 shards: last shard has padding head 24; grid > tiles
        (9, 8, 16, 2),  # 3 shards
    ],
)
def test_lookup_equals_ref(num_tokens, local_heads, head_start, grid, device):
    """Every element written (NaN poison), NaN codes included, bit-exact vs ref.py."""
    weight, scales = _table(300, seed=num_tokens, device=device)
    vocab_start = 1_000 + head_start
    vocab_end = vocab_start + 300
    ids = _ids(num_tokens, vocab_start, vocab_end, seed=local_heads, device=device)
    out = nan_empty(num_tokens, local_heads, DIM, device=device)
    _launch(
        engram_lookup_kernel_override,
        weight,
        scales,
        ids,
        out,
        vocab_start,
        vocab_end,
        head_start,
        local_heads,
        grid,
    )
    want = head_lookup_ref(weight, scales, ids, vocab_start, vocab_end, head_start, local_heads)
    _assert_same_bits(out, want, "bf16 lookup")
    assert out[0, 0, 0x7F].isnan()  # row 0 holds every code: 0x7F decodes to NaN


@pytest.mark.parametrize("num_tokens,local_heads,head_start", [(11, 12, 0), (6, 5, 20)])
def test_lookup_equals_vllm_kernel(num_tokens, local_heads, head_start, device):
    """vLLM's kernel under the interpreter, full scale range 0..255, no NaN codes."""
    weight, scales = _table(200, seed=3, nan_codes=False, min_scale=0, device=device)
    ids = _ids(num_tokens, 500, 700, seed=num_tokens, device=device)
    got, want = (
        nan_empty(num_tokens, local_heads, DIM, device=device),
        nan_empty(num_tokens, local_heads, DIM, device=device),
    )
    args = (weight, scales, ids)
    rest = (500, 700, head_start, local_heads, 3)
    _launch(engram_lookup_kernel_override, *args, got, *rest)
    _launch(_vllm(3), *args, want, *rest)
    _assert_same_bits(got, want, "bf16 lookup vs vLLM")


def test_rows_past_num_rows_untouched(device):
    """A launch covering fewer rows than ``out`` holds leaves the rest as they were."""
    weight, scales = _table(64, seed=1, device=device)
    ids = _ids(5, 0, 64, seed=2, device=device)
    out = nan_empty(5, 24, DIM, device=device)
    _launch(engram_lookup_kernel_override, weight, scales, ids, out, 0, 64, 0, 24, 2, num_rows=50)
    want = head_lookup_ref(weight, scales, ids, 0, 64, 0, 24)
    _assert_same_bits(out.view(-1, DIM)[:50], want.view(-1, DIM)[:50], "written rows")
    assert out.view(-1, DIM)[50:].isnan().all()


# ------------------------------------------------------------------ other modes


def test_packed_rows_equal_vllm_and_ref(device):
    """Packed bytes land in one layer's slice of a [T, layers, heads, 264] buffer; the
    other layer's bytes (0xFF poison) stay untouched."""
    weight, scales = _table(128, seed=5, nan_codes=False, min_scale=0, device=device)
    num_tokens, local_heads, head_start = 9, 12, 12
    ids = _ids(num_tokens, 40, 168, seed=5, device=device)
    width = DIM + DIM // QB
    outs = []
    for kernel in (engram_lookup_kernel_override, _vllm(2)):
        buffer = torch.full(
            (num_tokens, 2, local_heads, width), 0xFF, dtype=torch.uint8, device=device
        )
        _launch(
            kernel, weight, scales, ids, buffer[:, 1], 40, 168, head_start, local_heads, 2,
            packed=True,
        )  # fmt: skip
        outs.append(buffer)
    ours, theirs = outs
    assert (ours[:, 0] == 0xFF).all()
    _assert_same_bits(ours, theirs, "packed vs vLLM")
    want = head_lookup_ref(weight, scales, ids, 40, 168, head_start, local_heads, packed=True)
    _assert_same_bits(ours[:, 1], want, "packed vs ref")


@pytest.mark.parametrize("num_tokens,local_heads,head_start", [(7, 12, 12), (5, 5, 20)])
def test_sorted_lookup_equals_vllm_and_ref(num_tokens, local_heads, head_start, device):
    """Table-order mode, ids prepared as ParallelEngramEmbedding.lookup does (shard-local
    ids of this shard's heads, -1 pad for missing heads, sorted, with destinations)."""
    weight, scales = _table(96, seed=6, nan_codes=False, min_scale=10, device=device)
    vocab_start, vocab_end = 3_000, 3_096
    ids = _ids(num_tokens, vocab_start, vocab_end, seed=9, device=device)
    local = ids[:, head_start : head_start + local_heads] - vocab_start
    if (pad := local_heads - local.shape[1]) > 0:
        local = torch.nn.functional.pad(local, (0, pad), value=-1)
    local_ids, dst = local.flatten().sort()
    dst = dst.int()
    outs = []
    for kernel in (engram_lookup_kernel_override, _vllm(3)):
        out = nan_empty(num_tokens, local_heads, DIM, device=device)
        _launch(
            kernel, weight, scales, local_ids, out, vocab_start, vocab_end, head_start,
            local_heads, 3, sorted_dst=dst,
        )  # fmt: skip
        outs.append(out)
    _assert_same_bits(outs[0], outs[1], "sorted vs vLLM")
    want = sorted_lookup_ref(weight, scales, local_ids, dst, local_ids.numel(), 96)
    _assert_same_bits(outs[0].view(-1, DIM), want, "sorted vs ref")
    # Table order reaches the same rows as the unsorted lookup.
    plain = head_lookup_ref(weight, scales, ids, vocab_start, vocab_end, head_start, local_heads)
    _assert_same_bits(outs[0], plain, "sorted vs unsorted")


def test_peer_rows_equal_vllm_and_ref(device):
    """GPU tables row-split over DP peers: ``weight`` is the peers' buffer addresses."""
    peer_rows, ranks = 40, 3
    tables = [_table(peer_rows, seed=10 + r, nan_codes=False, device=device) for r in range(ranks)]
    buffers = [torch.cat([w.view(torch.uint8).flatten(), s.flatten()]) for w, s in tables]
    pointers = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
    weight, scales = peer_table_ref(buffers, peer_rows, DIM, QB)
    vocab_end = peer_rows * ranks - 7  # peers keep the full lookup range from row 0
    ids = _ids(8, 0, vocab_end, seed=11, device=device)
    outs = []
    for kernel in (engram_lookup_kernel_override, _vllm(2)):
        out = nan_empty(8, 24, DIM, device=device)
        _launch(
            kernel, pointers, tables[0][1], ids, out, 0, vocab_end, 0, 24, 2,
            peer_rows=peer_rows,
        )  # fmt: skip
        outs.append(out)
    _assert_same_bits(outs[0], outs[1], "peer vs vLLM")
    _assert_same_bits(outs[0], head_lookup_ref(weight, scales, ids, 0, vocab_end, 0, 24), "ref")


# ------------------------------------------------------------------ production geometry


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_v41_shard_geometry(layer, tp, device):
    """V4.1 shards: 24 heads over TP, vLLM's prime-bucket row ranges (192M-row offsets),
    ids drawn from each head's own bucket. The table is cut to its first 512 rows (a
    full shard is 16M rows a head: the gpu case), so vocab_end is vocab_start + 512."""
    layout = vllm_engram.EngramLayout(V41_ENGRAM)
    sizes = [p for order in layout.primes[layer] for p in order]
    local_heads = -(-HEADS // tp)
    rank = tp - 1
    head_start = rank * local_heads
    vocab_start, real_end = _shard(head_start, local_heads, sizes)
    assert real_end - vocab_start == sum(sizes[head_start : head_start + local_heads])
    vocab_end = vocab_start + 512
    g = torch.Generator().manual_seed(tp)
    num_tokens = 33
    bucket = torch.randint(0, 2**31 - 1, (num_tokens, HEADS), generator=g)
    ids = layout.offsets[layer] + bucket % torch.tensor(sizes)
    near = vocab_start + torch.randint(0, 512, ids.shape, generator=g)
    ids = torch.where(torch.rand(ids.shape, generator=g) < 0.5, near, ids)
    ids = ids.to(torch.int32).to(device)
    ids[-1] = -1  # a dead token (dummy hashes)
    weight, scales = _table(512, seed=layer, device=device)
    out = nan_empty(num_tokens, local_heads, DIM, device=device)
    grid = min(-(-num_tokens * local_heads // BLOCK_R), 108)  # A100: 108 SMs
    _launch(
        engram_lookup_kernel_override, weight, scales, ids, out, vocab_start, vocab_end,
        head_start, local_heads, grid,
    )  # fmt: skip
    want = head_lookup_ref(weight, scales, ids, vocab_start, vocab_end, head_start, local_heads)
    _assert_same_bits(out, want, f"TP{tp} layer {layer}")
    assert (out[-1] == 0).all()


# ------------------------------------------------------------------ through vLLM


def _fake_embedding(weight, scales, head_start, local_heads, vocab_start, vocab_end):
    """A ParallelEngramEmbedding as __init__ leaves it for a GPU-resident, unsorted,
    non-peer table (no process groups or CUDA needed to call lookup/forward)."""
    emb = vllm_engram.ParallelEngramEmbedding.__new__(vllm_engram.ParallelEngramEmbedding)
    torch.nn.Module.__init__(emb)
    emb.weight = torch.nn.Parameter(weight, requires_grad=False)
    emb.weight_scale_inv = torch.nn.Parameter(scales, requires_grad=False)
    emb.cpu_offload, emb.dp_size, emb.tp_size, emb.peer_rows = False, 1, 1, 0
    emb.head_start, emb.part_n_hash_cols, emb.n_hash_cols = head_start, local_heads, HEADS
    emb.vocab_start_idx, emb.vocab_end_idx = vocab_start, vocab_end
    emb.dim, emb.block_size, emb._num_sms = DIM, QB, 4
    return emb


@pytest.fixture
def overridden_lookup():
    """register_kernels(our impl) for the duration of one test, then vLLM's kernel back."""
    from vllm.triton_utils import dispatcher

    original = vllm_engram._engram_lookup_kernel
    dispatcher.register_kernels({KERNEL_NAME: engram_lookup_kernel_override})
    try:
        yield vllm_engram._engram_lookup_kernel
    finally:
        vllm_engram._engram_lookup_kernel = original
        dispatcher._registry.pop(KERNEL_NAME, None)


def test_register_kernels_routes_vllm_lookup(overridden_lookup, device):
    """vLLM's own ParallelEngramEmbedding.forward/lookup, with the kernel overridden by
    name, runs ours (on CPU the NaN codes tell: vLLM's kernel would give +-480 under the
    interpreter) and keeps vLLM's grid (tiles capped at its SM count)."""
    from vllm.triton_utils.dispatcher import KernelOverride

    assert isinstance(overridden_lookup, KernelOverride)
    assert overridden_lookup._forward_by_name
    weight, scales = _table(150, seed=21, device=device)
    ids = _ids(19, 7_000, 7_150, seed=21, device=device)
    got = _fake_embedding(weight, scales, 0, 24, 7_000, 7_150)(ids)
    assert got[0, 0, 0x7F].isnan()
    _assert_same_bits(got, head_lookup_ref(weight, scales, ids, 7_000, 7_150, 0, 24), "ref")

    # A sharded lookup into a view of the staging buffer (Engram.prepare_embeddings).
    staged = nan_empty(32, 12, DIM, device=device)
    _fake_embedding(weight, scales, 12, 12, 7_000, 7_150).lookup(ids, staged[:19])
    want = head_lookup_ref(weight, scales, ids, 7_000, 7_150, 12, 12)
    _assert_same_bits(staged[:19], want, "TP2 rank 1 lookup")
    assert staged[19:].isnan().all()


def test_register_kernels_matches_original_kernel_through_forward(device):
    """Same call through vLLM's forward, original kernel vs override (no NaN codes)."""
    from vllm.triton_utils import dispatcher

    weight, scales = _table(150, seed=22, nan_codes=False, min_scale=0, device=device)
    ids = _ids(23, 100, 250, seed=22, device=device)
    emb = _fake_embedding(weight, scales, 0, 24, 100, 250)
    theirs = emb(ids)
    original = vllm_engram._engram_lookup_kernel
    dispatcher.register_kernels({KERNEL_NAME: engram_lookup_kernel_override})
    try:
        ours = emb(ids)
    finally:
        vllm_engram._engram_lookup_kernel = original
        dispatcher._registry.pop(KERNEL_NAME, None)
    _assert_same_bits(ours, theirs, "forward, override vs vLLM kernel")


def test_zero_tokens(overridden_lookup, device):
    weight, scales = _table(16, seed=0, device=device)
    out = nan_empty(4, 24, DIM, device=device)
    ids = torch.zeros(0, HEADS, dtype=torch.int32, device=device)
    # vLLM returns before launching; a direct launch with no rows is a no-op too.
    _launch(engram_lookup_kernel_override, weight, scales, ids, out, 0, 16, 0, 24, 0)
    assert out.isnan().all()
    assert _fake_embedding(weight, scales, 0, 24, 0, 16)(ids).shape == (0, 24, DIM)


def test_errors_name_the_argument():
    weight, scales = _table(16, seed=0)
    ids = _ids(2, 0, 16, seed=0)
    out = nan_empty(2, 24, DIM)
    run = engram_lookup_kernel_override
    with pytest.raises(ValueError, match=r"out: expected dtype torch\.bfloat16"):
        _launch(run, weight, scales, ids, out.float(), 0, 16, 0, 24, 1)
    with pytest.raises(ValueError, match="weight: expected dtype"):
        _launch(run, weight.float(), scales, ids, out, 0, 16, 0, 24, 1)
    with pytest.raises(ValueError, match="scales: expected contiguous rows"):
        _launch(run, weight, scales[:, :4], ids, out, 0, 16, 0, 24, 1)
    with pytest.raises(ValueError, match=r"out: expected dtype torch\.uint8"):
        _launch(run, weight, scales, ids, out, 0, 16, 0, 24, 1, packed=True)
    with pytest.raises(ValueError, match="GRID"):
        _launch(run, weight, scales, ids, out, 0, 16, 0, 24, 0)


# ------------------------------------------------------------------ full size (GPU)


@pytest.mark.gpu
def test_full_tp4_shard_on_gpu(device):
    """A whole TP4 shard of layer 1 (6 heads x 16M rows = 25.6 GB: row offsets past
    2**31 bytes), 16384 tokens, every byte value: ours == vLLM's kernel (sm90+) == ref."""
    layout = vllm_engram.EngramLayout(V41_ENGRAM)
    sizes = [p for order in layout.primes[1] for p in order]
    vocab_start, vocab_end = _shard(18, 6, sizes)
    rows = vocab_end - vocab_start
    g = torch.Generator(device=device).manual_seed(0)
    weight = torch.randint(0, 256, (rows, DIM), generator=g, dtype=torch.uint8, device=device)
    scales = torch.randint(0, 256, (rows, DIM // QB), generator=g, dtype=torch.uint8, device=device)
    weight = weight.view(torch.float8_e4m3fn)
    num_tokens = 16384
    bucket = torch.randint(0, 2**31 - 1, (num_tokens, HEADS), generator=g, device=device)
    ids = (layout.offsets[1].to(device) + bucket % torch.tensor(sizes, device=device)).int()
    ids[::97] = -1
    grid = min(
        -(-num_tokens * 6 // BLOCK_R), torch.cuda.get_device_properties(0).multi_processor_count
    )
    got, want = (
        nan_empty(num_tokens, 6, DIM, device=device),
        nan_empty(num_tokens, 6, DIM, device=device),
    )
    _launch(
        engram_lookup_kernel_override, weight, scales, ids, got, vocab_start, vocab_end, 18, 6, grid
    )
    _launch(_vllm(grid), weight, scales, ids, want, vocab_start, vocab_end, 18, 6, grid)
    _assert_same_bits(got, want, "full shard vs vLLM")
    ref = head_lookup_ref(weight, scales, ids, vocab_start, vocab_end, 18, 6)
    _assert_same_bits(got, ref, "full shard vs ref")


@pytest.mark.gpu
def test_uva_host_table_on_gpu(device):
    """cpu_offload (vLLM's default): a pinned host table read through its UVA view."""
    from vllm.utils.torch_utils import get_accelerator_view_from_cpu_tensor

    weight, scales = _table(1 << 20, seed=4, min_scale=0)
    weight, scales = weight.pin_memory(), scales.pin_memory()
    uva_w = get_accelerator_view_from_cpu_tensor(weight)
    uva_s = get_accelerator_view_from_cpu_tensor(scales)
    ids = _ids(4097, 5, 5 + (1 << 20), seed=4, device=device)
    got, want = nan_empty(4097, 24, DIM, device=device), nan_empty(4097, 24, DIM, device=device)
    _launch(engram_lookup_kernel_override, uva_w, uva_s, ids, got, 5, 5 + (1 << 20), 0, 24, 54)
    _launch(_vllm(54), uva_w, uva_s, ids, want, 5, 5 + (1 << 20), 0, 24, 54)
    _assert_same_bits(got, want, "UVA vs vLLM")


# ------------------------------------------------------------------ Ampere fitness


def _vllm_spec(label, kernel, signature, constexprs, num_warps=4, num_stages=3, div16=()):
    """A spec for a vLLM Engram kernel as ParallelEngramEmbedding/Engram launch it on
    V4.1 (Triton's default num_stages=3 where vLLM passes none)."""
    return KernelSpec(
        label=label,
        kernel=f"{ENGRAM}:{kernel}",
        signature=signature,
        constexprs=constexprs,
        num_warps=num_warps,
        num_stages=num_stages,
        ints_divisible_by_16=div16,
    )


def vllm_kept_kernel_specs() -> list[KernelSpec]:
    """vLLM's Engram kernels we leave alone, at V4.1's shapes (hidden 5120, hc 4, 24 heads
    of 256, swa block 256, lookback depth 3)."""
    write = {
        "input_ids": "*i32",
        "token_map": "*i32",
        "dead_mask": "*u1",
        "slot_mapping": "*i64",
        "cache": "*i32",
        "num_tokens": "i32",
        "dead_id": "i32",
    }
    hash_sig = {
        "input_ids": "*i32",
        "token_map": "*i32",
        "dead_mask": "*u1",
        "positions": "*i64",
        "block_table": "*i32",
        "query_start_loc": "*i32",
        "multipliers": "*i64",
        "primes": "*i64",
        "offsets": "*i64",
        "cache": "*i32",
        "lookback_token_ids": "*i32",
        "lookback_dead_mask": "*u1",
        "output": "*i32",
        "num_tokens": "i32",
        "num_slots": "i32",
        "pad_id": "i32",
        "table_stride": "i32",
        "num_query_rows": "i32",
        "num_table_rows": "i32",
        "max_blocks": "i32",
        "cache_block_size": "i32",
        "num_heads": "i32",
        "dead_id": "i32",
        "lookback_depth": "i32",
        "lookback_row_stride": "i32",
        "lookback_mask_row_stride": "i32",
    }
    unit = {
        "input_stride": 1,
        "mask_stride": 1,
        "position_stride": 1,
        "table_col_stride": 1,
        "query_stride": 1,
        "lookback_col_stride": 1,
        "lookback_mask_col_stride": 1,
    }
    hash_cx = {**unit, "MAX_NGRAM": 4, "BLOCK_T": 32, "BLOCK_H": 8}
    v2_sig = {k: v for k, v in hash_sig.items() if k != "cache"}
    post = {
        "hidden_states": "*bf16",
        "kv": "*bf16",
        "q_weight": "*bf16",
        "k_weight": "*bf16",
        "token_mask": "*u1",
        "output": "*bf16",
        "num_kv_tokens": "i32",
        "hidden_stride_t": "i32",
        "hidden_stride_h": "i32",
        "kv_stride_t": "i32",
        "q_stride_h": "i32",
        "k_stride_h": "i32",
        "output_stride_t": "i32",
        "output_stride_h": "i32",
        "eps": "fp32",
        "clamp_value": "fp32",
    }
    post_unit = {
        "hidden_stride_d": 1,
        "kv_stride_d": 1,
        "q_stride_d": 1,
        "k_stride_d": 1,
        "mask_stride": 1,
        "output_stride_d": 1,
    }
    post_div16 = tuple(k for k in post if "stride" in k)
    specs = [
        _vllm_spec(
            "vllm.write_hash_cache",
            "_write_hash_cache_kernel",
            write,
            {"input_stride": 1, "mask_stride": 1, "slot_stride": 1, "BLOCK_SIZE": 256},
        ),
        _vllm_spec("vllm.hash_ids[v1 slot cache]", "_hash_ids_kernel", hash_sig, hash_cx),
        _vllm_spec("vllm.hash_ids[v2]", "_hash_ids_kernel", v2_sig, {**hash_cx, "cache": None}),
    ]
    for has_mask in (True,):  # Engram.forward always passes the image mask
        specs.append(
            _vllm_spec(
                f"vllm.post_wkv[mask={int(has_mask)}]",
                "_fused_engram_post_wkv_kernel",
                post,
                {**post_unit, "DIM": 5120, "HC_MULT": 4, "BLOCK_SIZE": 8192, "HAS_MASK": has_mask},
                num_warps=8,
                div16=post_div16,
            )
        )
    for local_heads in (12,):  # 2 DP-or-SP shards of 24 heads
        specs.append(
            _vllm_spec(
                f"vllm.select_rows[lh={local_heads}]",
                "_engram_select_rows_kernel",
                {
                    "gathered": "*bf16",
                    "output": "*bf16",
                    "num_tokens": "i32",
                    "token_start": "i32",
                    "num_elements": "i32",
                },
                {"LOCAL_WIDTH": local_heads * DIM, "WIDTH": HEADS * DIM, "BLOCK_SIZE": 1024},
            )
        )
    specs.append(
        _vllm_spec(
            "vllm.unpack_fp8",
            "_engram_unpack_fp8_kernel",
            {
                "packed": "*u8",
                "values": "*u8",
                "scales": "*u8",
                "num_tokens": "i32",
                "values_stride": "i32",
                "scales_stride": "i32",
            },
            {
                "HEADS": HEADS,
                "LOCAL_HEADS": 12,
                "LAYERS": 2,
                "RANK": 0,
                "DIM": DIM,
                "BLOCK": 16,
                "PEER": False,
            },
            div16=("values_stride", "scales_stride"),
        )
    )
    return specs


@pytest.fixture(scope="module")
def vllm_sm80_reports():
    """vLLM's kept Engram kernels and its lookup, compiled for sm_80 in one subprocess."""
    specs = [*vllm_kept_kernel_specs(), vllm_lookup_spec()]
    reports = compile_for_ampere(specs, ccs=[80])
    print("\n" + format_reports(reports))
    return {r.label: r for r in reports}


@pytest.mark.aot
def test_vllm_kept_engram_kernels_compile_for_sm80(vllm_sm80_reports):
    """The Engram kernels we do not replace compile for sm_80 as vLLM ships them."""
    kept = [vllm_sm80_reports[spec.label] for spec in vllm_kept_kernel_specs()]
    failed = [f"{r.label}: {r.error}" for r in kept if r.error]
    assert not failed, "\n".join(failed)


@pytest.mark.aot
def test_vllm_lookup_kernel_is_refused_on_sm80(vllm_sm80_reports):
    """Why the override exists: vLLM's lookup, table typed fp8e4nv, fails on sm_80."""
    report = vllm_sm80_reports["vllm.engram_lookup"]
    assert report.error is not None and "fp8e4nv" in report.error, report


def vllm_lookup_spec() -> KernelSpec:
    """vLLM's lookup as ParallelEngramEmbedding.lookup launches it on V4.1 (TP1, bf16)."""
    return _vllm_spec(
        "vllm.engram_lookup",
        "_engram_lookup_kernel",
        {
            "weight": "*fp8e4nv",
            "scales": "*u8",
            "ids": "*i32",
            "sorted_dst": "*i32",
            "out": "*bf16",
            "vocab_start": "i32",
            "vocab_end": "i32",
            "num_rows": "i32",
            "ids_stride_t": "i32",
            "ids_stride_h": "i32",
            "GRID": "i32",
            "SORTED": "i1",
        },
        {
            "HEAD_START": 0,
            "LOCAL_HEADS": 24,
            "TOTAL_HEADS": HEADS,
            "DIM": DIM,
            "QUANT_BLOCK": QB,
            "BLOCK_R": BLOCK_R,
            "PACKED": False,
            "OUT_STRIDE": HEADS * DIM,
            "PEER_ROWS": 0,
        },
    )
