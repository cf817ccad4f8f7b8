"""ops/indexer_logits: the sparse indexer's scoring kernels (DeepGEMM's fp8 MQA logits).

Tolerance. Queries and keys are e4m3 values decoded exactly (to fp16, times 2**-8), so
every product q_d * k_d is exact in fp32 and the kernels' only rounding is fp32
accumulation: D = 128 terms per head dot, then H weighted terms, then the scale (a
power of two: exact). The classic bound for n-term fp32 sums is n * u * sum|terms|;
we allow twice that with u = 2**-23 (round-toward-zero, which covers Tensor Cores'
truncating adds):

    |got - exact| <= (D + H + 4) * 2**-22 * scale * sum_h |w_h| * sum_d |q_hd * k_d|

(about 5e-5 of that magnitude at D = 128, H = 64; observed errors are ~1e-8). Against
vLLM's ``fp8_mqa_logits_torch``, which rounds each head's dot to bf16 (8 significant
bits) before the relu, the budget adds 2**-8 of the magnitude; against vLLM's fp32
``fp8_paged_mqa_logits_torch`` it is the fp32 bound twice (both sides round).
``ref.py`` computes in float64 and rounds once, so it is the exact value to ~2**-50.
"""

import inspect
import os

import pytest
import torch
import triton
import triton.language as tl

from deepinfer_sm80.ops.indexer_logits import (
    fp8_fp4_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    get_paged_mqa_logits_metadata,
    mqa_logits_into,
    paged_mqa_logits_into,
)
from deepinfer_sm80.ops.indexer_logits.e4m3_fp16 import (
    E4M3X4_TO_F16_PTX,
    F16_OPERAND_SCALE,
    e4m3_to_f16_scaled,
    e4m3_to_f16_scaled_packed,
)
from deepinfer_sm80.ops.indexer_logits.layout import allocate_cache, page_views
from deepinfer_sm80.ops.indexer_logits.ref import (
    decode_e4m3,
    insert_index_k_ref,
    mqa_logits_ref,
    paged_mqa_logits_ref,
    quantize_index_k_ref,
    row_lengths,
)
from tools import mutants
from tools.poison import nan_empty

D = 128
TOPK = 512


def _vllm(module: str):
    if os.environ.get("DEEPINFER_REQUIRE_VLLM") == "1":
        import importlib

        return importlib.import_module(module)
    return pytest.importorskip(module)


def fp32_budget(heads: int) -> float:
    return (D + heads + 4) * 2.0**-22


# ------------------------------------------------------------------ inputs


def make_queries(shape: tuple[int, ...], heads: int, seed: int, device) -> torch.Tensor:
    """e4m3 queries quantized per (token, head) to +-448 like vLLM's fused Q kernel."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.tensor(shape).prod()) * heads
    x = (
        torch.randn(n, D, generator=g)
        * torch.logspace(-2, 2, n)[torch.randperm(n, generator=g), None]
    )
    values, _ = quantize_index_k_ref(x)
    return values.view(*shape, heads, D).view(torch.float8_e4m3fn).to(device)


def make_keys(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 bytes [n, D], fp32 scales [n]) from keys spanning 8 decades, with outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g) * torch.logspace(-4, 4, max(n, 1))[:n, None]
    x = torch.where(torch.rand(n, D, generator=g) < 0.02, x * 30, x)
    return quantize_index_k_ref(x)


def make_weights(rows: int, heads: int, seed: int, device) -> torch.Tensor:
    """Head weights of both signs (weights_proj output times the folded scales)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, heads, generator=g) * 0.05).to(device)


def make_prefill(reqs, ratio: int, heads: int, seed: int, device):
    """A prefill chunk as vLLM builds it: ``reqs`` = [(context_len, query_len)] in
    uncompressed tokens; keys are each request's compressed positions gathered back to
    back; row i of a request sees ``(start + 1 + i) // ratio`` of them."""
    comp = [(ctx + qlen) // ratio for ctx, qlen in reqs]
    k_bytes, k_scale = make_keys(sum(comp), seed)
    ks, ke, start = [], [], 0
    for (ctx, qlen), n in zip(reqs, comp, strict=True):
        for i in range(qlen):
            ks.append(start)
            ke.append(start + (ctx + 1 + i) // ratio)
        start += n
    rows = len(ks)
    t = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    q = make_queries((rows,), heads, seed + 1, device)
    k = k_bytes.view(torch.float8_e4m3fn).to(device)
    return (
        q,
        k,
        k_scale.to(device),
        make_weights(rows, heads, seed + 2, device),
        t(ks),
        t(ke),
        max(comp),
    )


def make_paged(lens, block_size: int, heads: int, next_n: int, seed: int, device, pad: int = 576):
    """A paged index cache holding ``lens[b]`` keys per request (pages shuffled, page
    stride padded by ``pad`` bytes, every unwritten byte 0xFF = e4m3 NaN), plus queries
    ``[B, next_n, H, D]`` and weights."""
    pages = [max(1, -(-n // block_size)) for n in lens]
    num_blocks = sum(pages) + 2
    cache = allocate_cache(num_blocks, block_size, page_bytes=block_size * (D + 4) + pad, fill=0xFF)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g).int()
    table = torch.zeros(len(lens), max(pages) + 1, dtype=torch.int32)
    first = 0
    for b, (n, p) in enumerate(zip(lens, pages, strict=True)):
        table[b, :p] = perm[first : first + p]
        first += p
        values, scales = make_keys(n, seed + 10 + b)
        pos = torch.arange(n)
        slots = table[b, pos // block_size].long() * block_size + pos % block_size
        insert_index_k_ref(values, scales, cache, slots)
    flat = cache.as_strided((num_blocks * cache.stride(0),), (1,)).to(device)
    cache = flat.as_strided(cache.shape, cache.stride())
    q = make_queries((len(lens), next_n), heads, seed + 1, device)
    w = make_weights(len(lens) * next_n, heads, seed + 2, device)
    return cache, table.to(device), q, w


# ------------------------------------------------------------------ checks


def check_prefill(out, q, k, k_scale, w, ks, ke, budget) -> torch.Tensor:
    """Every element written; [0, len) within the budget of the exact logits, [len, W)
    -inf. Returns the exact logits (on the CPU)."""
    width = out.shape[1]
    want = mqa_logits_ref(q, k, k_scale, w, ks, ke, width).cpu()
    mag = mqa_logits_ref(q, k, k_scale, w, ks, ke, width, magnitude=True).cpu()
    got = out.cpu()
    assert not got.isnan().any(), f"{int(got.isnan().sum())} elements left unwritten"
    lens = (torch.minimum(ke.cpu(), torch.tensor(k.shape[0])) - ks.cpu()).clamp(0, width)
    inside = torch.arange(width)[None, :] < lens[:, None]
    assert torch.isneginf(got[~inside]).all(), "columns past a row's keys must be -inf"
    _assert_within(got[inside], want[inside], mag[inside], budget)
    return want


def check_paged(out, q, cache, w, lens, table, budget, width) -> torch.Tensor:
    """[0, L) within the budget, [L, L_request) -inf, the rest untouched (NaN).
    Returns the exact logits (on the CPU, -inf past each row)."""
    batch, next_n = q.shape[:2]
    want = paged_mqa_logits_ref(q, cache, w, lens, table, width).cpu()
    mag = paged_mqa_logits_ref(q, cache, w, lens, table, width, magnitude=True).cpu()
    got = out.cpu()
    row_len = row_lengths(lens.cpu(), batch, next_n).clamp(max=width)
    req_len = row_len.view(batch, next_n).amax(1).repeat_interleave(next_n)
    cols = torch.arange(width)[None, :]
    inside = cols < row_len[:, None]
    masked = (cols >= row_len[:, None]) & (cols < req_len[:, None])
    assert torch.isfinite(got[inside]).all(), "a logit below its row's length is missing"
    assert torch.isneginf(got[masked]).all(), "between a row's and its request's length: -inf"
    assert got[cols >= req_len[:, None]].isnan().all(), "past the request's keys: untouched"
    _assert_within(got[inside], want[inside], mag[inside], budget)
    return want


def _assert_within(got, want, mag, budget):
    err = (got.double() - want.double()).abs()
    allowed = budget * mag
    bad = err > allowed
    worst = float((err / allowed.clamp_min(1e-300)).max()) if err.numel() else 0.0
    assert not bad.any(), f"{int(bad.sum())} logits off the budget; worst {worst:.3g}x it"


def _check_topk_selection(got, want, k_top=TOPK, got_idx=None):
    """The keys selected from ``got`` are a valid top-k of ``want``: with E the largest
    |got - want| of the row, each scores >= the k-th best reference score - 2E."""
    finite = torch.isfinite(want)
    for r in range(want.shape[0]):
        n = int(finite[r].sum())
        if got_idx is None:
            idx = torch.topk(torch.where(finite[r], got[r], float("-inf")), min(k_top, n)).indices
        else:
            idx = got_idx[r][got_idx[r] >= 0].long()
            assert idx.numel() == min(k_top, n) and (got_idx[r][idx.numel() :] == -1).all()
        if n == 0:
            continue
        err = (got[r][finite[r]].double() - want[r][finite[r]].double()).abs().max()
        kth = torch.topk(want[r][finite[r]], min(k_top, n)).values[-1].double()
        assert (want[r, idx].double() >= kth - 2 * err - 1e-30).all(), r


# ------------------------------------------------------------------ decode of e4m3


@triton.jit
def _decode_all_bytes(x_ptr, y_ptr, y_packed_ptr):
    o = tl.arange(0, 256)
    b = tl.load(x_ptr + o)
    tl.store(y_ptr + o, e4m3_to_f16_scaled(b))
    tl.store(y_packed_ptr + o, e4m3_to_f16_scaled_packed(b))


def test_e4m3_to_f16_is_exact_for_every_byte(device):
    """Both decodes (on a GPU the packed one is the PTX the kernels run) give the exact
    value times 2**-8 for every byte, NaN for the two NaN codes, the same bits."""
    x = torch.arange(256, dtype=torch.uint8, device=device)
    y = torch.full((256,), float("nan"), dtype=torch.float16, device=device)
    y_packed = torch.full_like(y, float("nan"))
    _decode_all_bytes[(1,)](x, y, y_packed)
    want = decode_e4m3(x.cpu()) * F16_OPERAND_SCALE
    got = y.cpu().double()
    assert torch.equal(got.isnan(), want.isnan()) and want.isnan().sum() == 2
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])
    assert torch.equal(y_packed.view(torch.int16), y.view(torch.int16))


def _run_ptx(text: str, operands: dict[str, int]) -> dict[str, int]:
    """A model of the few 32-bit PTX instructions the packed decode uses, enough to run
    its text on a CPU: prmt (default mode), shr, and, or, add, mul.lo and lop3."""
    mask32 = 0xFFFFFFFF
    regs = dict(operands)

    def val(token: str) -> int:
        token = token.strip()
        return regs[token] if token in regs else int(token, 0)

    def lop3(a: int, b: int, c: int, lut: int) -> int:
        out = 0
        for k in range(8):
            if lut >> k & 1:
                term = (a if k & 4 else ~a) & (b if k & 2 else ~b) & (c if k & 1 else ~c)
                out |= term & mask32
        return out

    def prmt(a: int, b: int, sel: int) -> int:
        src = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
        out = 0
        for i in range(4):
            nib = sel >> 4 * i & 0xF
            byte = src[nib & 7]
            if nib & 8:
                byte = 0xFF if byte & 0x80 else 0
            out |= byte << 8 * i
        return out

    ops = {
        "shr.b32": lambda a, b: a >> b,
        "and.b32": lambda a, b: a & b,
        "or.b32": lambda a, b: a | b,
        "add.u32": lambda a, b: a + b,
        "mul.lo.u32": lambda a, b: a * b,
    }
    for line in text.strip().splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *srcs = [a.strip() for a in args.split(",")]
        values = [val(a) for a in srcs]
        if op == "prmt.b32":
            regs[dst] = prmt(*values)
        elif op == "lop3.b32":
            regs[dst] = lop3(*values)
        else:
            regs[dst] = ops[op](*values) & mask32
    return regs


def test_packed_decode_ptx_text_places_every_byte_in_every_position(device):
    """The PTX the GPU runs, executed by a CPU model: each of the 4 bytes of a register,
    set to each of the 256 values (the others to varied bytes), must give the bits of
    the elementwise decode, which the test above ties to the exact value."""
    x = torch.arange(256, dtype=torch.uint8, device=device)
    y = torch.full((256,), float("nan"), dtype=torch.float16, device=device)
    _decode_all_bytes[(1,)](x, y, torch.empty_like(y))
    want = y.cpu().view(torch.int16).to(torch.int64) & 0xFFFF
    for pos in range(4):
        for v in range(256):
            lanes = [(v + 37 * i + 11) & 0xFF for i in range(4)]
            lanes[pos] = v
            word = sum(b << 8 * i for i, b in enumerate(lanes))
            regs = _run_ptx(E4M3X4_TO_F16_PTX.value, {"$2": word})
            halves = [regs["$0"] & 0xFFFF, regs["$0"] >> 16, regs["$1"] & 0xFFFF, regs["$1"] >> 16]
            assert halves == [int(want[b]) for b in lanes], (pos, v, [hex(h) for h in halves])


def test_subnormal_operands_are_not_flushed(device):
    """e4m3 subnormals decode to fp16 subnormals; the dot must keep them (on a GPU this
    checks the Tensor Cores do not flush them). Each head's query is one subnormal byte
    against a key of 1.0, so every logit is an exact small sum."""
    heads, rows = 32, 2
    qb = torch.zeros(rows, heads, D, dtype=torch.uint8)
    qb[:, :, 5] = (
        torch.arange(1, 8).repeat(rows * heads)[: rows * heads].view(rows, heads).to(torch.uint8)
    )  # 0x01..0x07: e4m3 subnormals 2**-9 .. 7 * 2**-9
    kb = torch.zeros(3, D, dtype=torch.uint8)
    kb[:, 5] = 0x38  # 1.0
    q = qb.view(torch.float8_e4m3fn).to(device)
    k = kb.view(torch.float8_e4m3fn).to(device)
    k_scale = torch.tensor([1.0, 2.0**-20, 2.0**20], device=device)
    w = torch.ones(rows, heads, device=device)
    t = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    out = fp8_fp4_mqa_logits((q, None), (k, k_scale), w, t([0, 0]), t([3, 3]), 3)
    want = mqa_logits_ref(
        q.cpu(), k.cpu(), k_scale.cpu(), w.cpu(), t([0, 0]).cpu(), t([3, 3]).cpu(), 3
    )
    assert torch.equal(out.cpu(), want) and (want > 0).all()


# ------------------------------------------------------------------ prefill


@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize(
    "reqs,ratio",
    [
        ([(0, 5)], 1),  # fresh request: 1..5 keys, causal
        ([(37, 3), (0, 4), (200, 2)], 1),  # three requests back to back, odd lengths
        ([(0, 7), (99, 3)], 2),  # ratio 2: first rows see 0 keys
    ],
)
def test_prefill_equals_reference(device, heads, reqs, ratio):
    q, k, k_scale, w, ks, ke, width = make_prefill(
        reqs, ratio, heads, seed=len(reqs) + ratio, device=device
    )
    out = nan_empty(q.shape[0], width, dtype=torch.float32, device=device)
    assert mqa_logits_into(out, q, k, k_scale, w, ks, ke) is out
    check_prefill(out, q, k, k_scale, w, ks, ke, fp32_budget(heads))


def _prefill_mutant(mutant, q, k, k_scale):
    """((q, k, k_scale) for the kernel, mutate for its output): ``mutant`` of the prefill
    logits. No sink here, so that mutant does not apply; the kernel sums over heads, so
    swapping two heads swaps two query heads (their weights stay)."""
    if mutant == "scale":
        return (q, k, k_scale), mutants.scale
    if mutant == "drop-tile":
        return (q, k, k_scale), mutants.zero_column_tile
    if mutant == "ue8m0-exponent":
        return (q, k, mutants.shift_scale_exponent(k_scale, 5)), None
    if mutant == "neighbour-row":
        return (q, *mutants.read_neighbour_key(k, k_scale, 5)), None
    if mutant == "swap-heads":
        return (mutants.swap_heads(q, 0, 1, dim=1), k, k_scale), None
    raise ValueError(f"mutant {mutant!r} does not apply to the indexer logits")


@pytest.mark.parametrize("mutant", [m for m in mutants.MUTANTS if m != "ignore-sink"])
def test_prefill_check_rejects_every_mutant(device, mutant):
    """Three requests back to back, 32 heads: the kernel passes check_prefill, each
    mutant of it fails there, on the budget."""
    q, k, k_scale, w, ks, ke, width = make_prefill(
        [(37, 3), (0, 4), (200, 2)], 1, 32, seed=4, device=device
    )
    out = nan_empty(q.shape[0], width, dtype=torch.float32, device=device)
    mqa_logits_into(out, q, k, k_scale, w, ks, ke)
    check_prefill(out, q, k, k_scale, w, ks, ke, fp32_budget(32))
    (mq, mk, ms), mutate = _prefill_mutant(mutant, q, k, k_scale)
    if mutate is None:
        out = nan_empty(q.shape[0], width, dtype=torch.float32, device=device)
        mqa_logits_into(out, mq, mk, ms, w, ks, ke)
    else:
        out = mutate(out)
    with pytest.raises(AssertionError, match="logits off the budget"):
        check_prefill(out, q, k, k_scale, w, ks, ke, fp32_budget(32))


def test_prefill_clips_and_writes_through_a_strided_view(device):
    """ke past the keys is clipped, ranges longer than the width are cut at the width,
    empty rows are all -inf, and a row-strided output view is honoured."""
    q, k, k_scale, w, _, _, _ = make_prefill([(70, 4)], 1, 32, seed=3, device=device)
    t = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    ks, ke = t([0, 5, 30, 74]), t([74, 5, 200, 74])
    backing = nan_empty(4, 80, dtype=torch.float32, device=device)
    out = backing[:, :61]
    mqa_logits_into(out, q, k, k_scale, w, ks, ke)
    check_prefill(out, q, k, k_scale, w, ks, ke, fp32_budget(32))
    assert backing[:, 61:].isnan().all()


@pytest.mark.vllm
@pytest.mark.parametrize("heads", [32, 64])
def test_prefill_equals_vllm_torch_reference(heads):
    """vLLM's ``fp8_mqa_logits_torch`` returns [M, N] with key n in column n; ours is
    DeepGEMM's compressed layout, so row m's columns [0, ke - ks) are its [ks, ke)."""
    vllm_ops = _vllm("vllm.v1.attention.ops.rocm_aiter_mla_sparse")
    q, k, k_scale, w, ks, ke, width = make_prefill(
        [(50, 3), (0, 6)], 1, heads, seed=9, device="cpu"
    )
    ours = fp8_fp4_mqa_logits((q, None), (k, k_scale), w, ks, ke, width)
    theirs = vllm_ops.fp8_mqa_logits_torch(q, (k, k_scale), w, ks, ke)
    mag = mqa_logits_ref(q, k, k_scale, w, ks, ke, width, magnitude=True)
    for m in range(q.shape[0]):
        s, e = int(ks[m]), int(ke[m])
        assert torch.isneginf(theirs[m, :s]).all() and torch.isneginf(theirs[m, e:]).all()
        err = (ours[m, : e - s].double() - theirs[m, s:e].double()).abs()
        assert (err <= (2.0**-8 + 2 * fp32_budget(heads)) * mag[m, : e - s]).all()
        assert torch.isneginf(ours[m, e - s :]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("reqs,ratio", [([(16000, 512)], 1), ([(60000, 700), (3000, 300)], 2)])
def test_prefill_production_shapes(device, heads, reqs, ratio):
    q, k, k_scale, w, ks, ke, width = make_prefill(reqs, ratio, heads, seed=5, device=device)
    out = nan_empty(q.shape[0], width, dtype=torch.float32, device=device)
    mqa_logits_into(out, q, k, k_scale, w, ks, ke)
    want = check_prefill(out, q, k, k_scale, w, ks, ke, fp32_budget(heads))
    _check_topk_selection(out.cpu(), want)


def test_prefill_zero_rows_and_zero_width(device):
    q, k, k_scale, w, ks, ke, _ = make_prefill([(3, 2)], 1, 32, seed=1, device=device)
    empty = fp8_fp4_mqa_logits((q[:0], None), (k, k_scale), w[:0], ks[:0], ke[:0], 7)
    assert empty.shape == (0, 7) and empty.dtype == torch.float32
    none = fp8_fp4_mqa_logits((q, None), (k, k_scale), w, ks, ke, 0)
    assert none.shape == (2, 0)
    all_empty = fp8_fp4_mqa_logits((q, None), (k, k_scale), w, ks, ks, 9)
    assert torch.isneginf(all_empty).all()


def test_prefill_is_batch_invariant(device):
    """A row's logits do not depend on the rows launched with it (bit for bit)."""
    q, k, k_scale, w, ks, ke, width = make_prefill([(20, 6), (9, 5)], 1, 64, seed=4, device=device)
    full = fp8_fp4_mqa_logits((q, None), (k, k_scale), w, ks, ke, width)
    for m in (0, 7, 10):
        alone = fp8_fp4_mqa_logits(
            (q[m : m + 1], None), (k, k_scale), w[m : m + 1], ks[m : m + 1], ke[m : m + 1], width
        )
        assert torch.equal(alone[0].view(torch.int32), full[m].view(torch.int32))


# ------------------------------------------------------------------ paged decode


@pytest.mark.parametrize(
    "heads,next_n,block_size,per_row",
    [(64, 1, 128, False), (32, 1, 64, True), (64, 2, 64, True), (32, 2, 128, False)],
)
def test_paged_equals_reference(device, heads, next_n, block_size, per_row):
    """Cache pages shuffled and padded, unwritten bytes 0xFF (NaN if read), output
    NaN-poisoned: [0, L) are logits, [L, L_request) -inf, the rest untouched."""
    lens = [0, 1, 130, 67] if next_n == 1 else [1, 129, 0, 66]
    cache, table, q, w = make_paged(
        lens, block_size, heads, next_n, seed=heads + block_size, device=device
    )
    ctx = torch.tensor(lens, dtype=torch.int32, device=device)
    if per_row:  # vLLM's (B, next_n) form: row j sees len - next_n + 1 + j keys
        ctx = row_lengths(ctx.cpu(), len(lens), next_n).view(len(lens), next_n).int().to(device)
    else:
        ctx = ctx[:, None] if next_n == 1 else ctx
    width = 256
    out = nan_empty(len(lens) * next_n, width, dtype=torch.float32, device=device)
    paged_mqa_logits_into(out, q, cache.unsqueeze(-2), w, ctx, table)
    check_paged(out, q, cache, w, ctx, table, fp32_budget(heads), width)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,next_n", [(32, 1), (32, 2), (64, 2)])
def test_paged_replays_under_cuda_graph(device, heads, next_n):
    """vLLM captures decode (the indexer included) in CUDA graphs: capture once, change
    queries, weights and lengths in place, replay, and get the bits an eager call on the
    new inputs gives (-inf and untouched columns included)."""
    lens = [300, 70, 190, 64]  # keys written per request (the rest of a page is NaN)
    cache, table, q, w = make_paged(lens, 64, heads, next_n, seed=5, device=device)
    ctx = torch.tensor([5, 70, 129, 0], dtype=torch.int32, device=device)
    width = 320
    out = nan_empty(len(lens) * next_n, width, dtype=torch.float32, device=device)
    paged_mqa_logits_into(out, q, cache.unsqueeze(-2), w, ctx, table)  # compile first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_mqa_logits_into(out, q, cache.unsqueeze(-2), w, ctx, table)
    _, _, q_new, w_new = make_paged(lens, 64, heads, next_n, seed=6, device=device)
    q.copy_(q_new)
    w.copy_(w_new)
    ctx.copy_(torch.tensor([300, 3, 190, 64], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    eager = nan_empty(len(lens) * next_n, width, dtype=torch.float32, device=device)
    paged_mqa_logits_into(eager, q, cache.unsqueeze(-2), w, ctx, table)
    assert torch.equal(out.view(torch.int32), eager.view(torch.int32))
    check_paged(out, q, cache, w, ctx, table, fp32_budget(heads), width)


def test_paged_context_longer_than_width_and_transposed_table(device):
    """Lengths are clipped to max_model_len; a block table with stride(1) != 1 works."""
    cache, table, q, w = make_paged([150, 20], 64, 32, 1, seed=2, device=device)
    table_t = table.t().contiguous().t()
    assert table_t.stride(1) != 1
    ctx = torch.tensor([[150], [20]], dtype=torch.int32, device=device)
    out = nan_empty(2, 100, dtype=torch.float32, device=device)
    paged_mqa_logits_into(out, q, cache, w, ctx, table_t)
    check_paged(out, q, cache, w, ctx, table, fp32_budget(32), 100)


@pytest.mark.vllm
@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_equals_vllm_torch_reference(next_n):
    """vLLM's ``fp8_paged_mqa_logits_torch``. Its next_n == 1 branch reads the real
    page layout (values, then scales); its next_n > 1 branch (DeepGEMM's test) reads
    each position's 128 values followed by its scale, so it is given that interleaved
    copy of the same cache. Unpadded pages: vLLM's reference ignores the page stride."""
    vllm_ops = _vllm("vllm.v1.attention.ops.rocm_aiter_mla_sparse")
    lens, block_size, heads, width = [70, 0, 129], 64, 64, 192
    cache, table, q, w = make_paged(lens, block_size, heads, next_n, seed=11, device="cpu", pad=0)
    ctx = torch.tensor(lens, dtype=torch.int32)
    ctx = ctx[:, None] if next_n == 1 else ctx
    ours = fp8_fp4_paged_mqa_logits((q, None), cache.unsqueeze(-2), w, ctx, table, None, width)
    if next_n == 1:
        vllm_cache = cache.unsqueeze(-2)
    else:
        values, scales = page_views(cache, block_size)
        inter = torch.cat(
            [values, scales.contiguous().view(torch.uint8).view(*scales.shape, 4)], -1
        )
        vllm_cache = inter.unsqueeze(-2)
    theirs = vllm_ops.fp8_paged_mqa_logits_torch(q, vllm_cache, w, ctx, table, width)
    mag = paged_mqa_logits_ref(q, cache, w, ctx, table, width, magnitude=True)
    row_len = row_lengths(ctx, len(lens), next_n)
    for r in range(len(lens) * next_n):
        n = int(row_len[r])
        err = (ours[r, :n].double() - theirs[r, :n].double()).abs()
        assert (err <= 2 * fp32_budget(heads) * mag[r, :n]).all(), r
        req_len = max(int(x) for x in row_len[r - r % next_n : r - r % next_n + next_n])
        assert torch.isneginf(theirs[r, n:]).all() and torch.isneginf(ours[r, n:req_len]).all()


@pytest.mark.vllm
def test_decode_topk_through_vllms_selector():
    """vLLM's decode top-k (its pure-torch backend, same row ends as persistent_topk)
    picks the same keys from our logits, garbage past the rows included, as from the
    reference logits."""
    topk_mod = _vllm("vllm.model_executor.layers.indexer_topk")
    lens, next_n, k_top = [300, 5, 0], 2, 64
    cache, table, q, w = make_paged(lens, 64, 32, next_n, seed=21, device="cpu")
    ctx = torch.tensor(lens, dtype=torch.int32)[:, None]
    out = torch.full((len(lens) * next_n, 320), float("nan"))
    paged_mqa_logits_into(out, q, cache, w, ctx, table)
    want = paged_mqa_logits_ref(q, cache, w, ctx, table, 320)
    got_idx = torch.full((out.shape[0], k_top), -7, dtype=torch.int32)
    topk_mod.SparseIndexerTopk("torch").forward(out, ctx, next_n, got_idx, k_top, max(lens))
    _check_topk_selection(out, want, k_top, got_idx)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads,next_n,block_size", [(64, 1, 128), (32, 1, 64), (64, 2, 64), (32, 2, 128)]
)
def test_paged_production_shapes(device, heads, next_n, block_size):
    lens = [262144, 65537, 4097, 0, 513, 1]
    width = 1048576 // (1 if block_size == 128 else 2)
    cache, table, q, w = make_paged(lens, block_size, heads, next_n, seed=7, device=device)
    ctx = torch.tensor(lens, dtype=torch.int32, device=device)[:, None]
    out = nan_empty(len(lens) * next_n, width, dtype=torch.float32, device=device)
    paged_mqa_logits_into(out, q, cache, w, ctx, table)
    want = check_paged(out, q, cache, w, ctx, table, fp32_budget(heads), width)
    _check_topk_selection(out.cpu(), want)


def test_paged_zero_requests_and_empty_contexts(device):
    cache, table, q, w = make_paged([0, 0], 64, 32, 1, seed=1, device=device)
    ctx = torch.zeros(2, 1, dtype=torch.int32, device=device)
    out = nan_empty(2, 64, dtype=torch.float32, device=device)
    paged_mqa_logits_into(out, q, cache, w, ctx, table)
    assert out.isnan().all(), "empty contexts write nothing"
    none = fp8_fp4_paged_mqa_logits((q[:0], None), cache, w[:0], ctx[:0], table[:0], None, 64)
    assert none.shape == (0, 64)


# ------------------------------------------------------------------ vLLM contract


@pytest.mark.vllm
@pytest.mark.parametrize(
    "name", ["fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata"]
)
def test_signatures_equal_vllms_deep_gemm_wrappers(name):
    vllm_dg = _vllm("vllm.utils.deep_gemm")
    import deepinfer_sm80.ops.indexer_logits as ours

    assert inspect.signature(getattr(ours, name)) == inspect.signature(getattr(vllm_dg, name))


def test_metadata_has_the_shape_vllms_builder_copies(device):
    meta = get_paged_mqa_logits_metadata(
        torch.ones(3, 1, dtype=torch.int32, device=device), 64, 108
    )
    assert meta.shape == (109, 2) and meta.dtype == torch.int32


def test_errors_name_the_argument(device):
    q, k, k_scale, w, ks, ke, _ = make_prefill([(3, 2)], 1, 32, seed=1, device=device)
    with pytest.raises(ValueError, match="q: a query scale tensor"):
        fp8_fp4_mqa_logits((q, torch.ones(2, 32, dtype=torch.int32)), (k, k_scale), w, ks, ke, 4)
    with pytest.raises(ValueError, match="q: int8 means packed MXFP4"):
        fp8_fp4_mqa_logits((q.view(torch.int8), None), (k, k_scale), w, ks, ke, 4)
    with pytest.raises(ValueError, match=r"weights: expected dtype torch\.float32"):
        fp8_fp4_mqa_logits((q, None), (k, k_scale), w.bfloat16(), ks, ke, 4)
    with pytest.raises(ValueError, match="k_scale: expected"):
        fp8_fp4_mqa_logits((q, None), (k, k_scale[:-1]), w, ks, ke, 4)
    with pytest.raises(ValueError, match=r"cu_seqlen_ke: expected dtype torch\.int32"):
        fp8_fp4_mqa_logits((q, None), (k, k_scale), w, ks, ke.long(), 4)
    with pytest.raises(ValueError, match="q: heads must be a power of two"):
        fp8_fp4_mqa_logits((q[:, :24], None), (k, k_scale), w[:, :24], ks, ke, 4)
    cache, table, qd, wd = make_paged([5], 64, 32, 1, seed=1, device=device)
    ctx = torch.tensor([[5]], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="indices: the varlen"):
        fp8_fp4_paged_mqa_logits((qd, None), cache, wd, ctx, table, None, 64, indices=ctx[0])
    with pytest.raises(ValueError, match="kv_cache: expected 132 bytes per position"):
        fp8_fp4_paged_mqa_logits((qd, None), cache[..., :68], wd, ctx, table, None, 64)
    with pytest.raises(ValueError, match="context_lens: expected"):
        fp8_fp4_paged_mqa_logits(
            (qd, None), cache, wd, ctx.view(1, 1).expand(1, 3), table, None, 64
        )
