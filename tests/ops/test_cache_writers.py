"""ops/cache_writers: the indexer K and compressed KV writers, byte for byte.

Oracles:
- vLLM 0.33.0's own writers, run on CPU under Triton's interpreter. Its fp32->fp8e4nv
  cast there rounds ties up and mishandles carries and subnormals, and its fp32->bf16
  cast truncates (``test_interpreter_casts_are_not_the_gpus`` shows both), so those
  two casts are replaced by the GPU's (round to nearest even, saturating) while vLLM's
  kernels run (``gpu_casts``). Everything else in vLLM's kernels runs as written.
- ``ref.py``: PyTorch encoder and writers.

Every cache starts poisoned with 0xFF (page padding included) and is compared whole, so
a byte written where it must not be, or not written where it must, fails.
"""

import contextlib
import inspect
import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from deepinfer_sm80.ampere_fit import (
    compile_for_ampere,
    format_reports,
)
from deepinfer_sm80.kernel_spec import KernelSpec
from deepinfer_sm80.ops.cache_writers import indexer_k_norm_rope_store, rope_quant_insert
from deepinfer_sm80.ops.cache_writers.layout import INDEX_RECORD_BYTES, index_page_bytes
from deepinfer_sm80.ops.cache_writers.ref import (
    bf16_bits_ref,
    indexer_k_rows_ref,
    indexer_k_store_ref,
    indexer_page_views,
    rope_quant_insert_ref,
    scale_bytes_ref,
    ue8m0_e4m3_quantize_ref,
    ue8m0_exponent_ref,
)
from deepinfer_sm80.ops.cache_writers.triton_kernel import (
    ampere_kernel_specs,
    bf16_rne_bits,
    ue8m0_exponent,
)
from deepinfer_sm80.ops.fp8.ref import e4m3_decode_ref
from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES, page_bytes
from deepinfer_sm80.ops.kv_cache.ref import encode_records_ref, page_views
from tools.poison import cache_bytes, move_cache, paged_cache

_V41_OPS = "vllm.models.deepseek_v41.common.ops"
ON_GPU = os.environ.get("DEEPINFER_TEST_DEVICE", "").lower() == "cuda"  # as conftest decides
cpu_only = pytest.mark.skipif(ON_GPU, reason="interpreter oracle: CPU tier only")


def _import_vllm(name: str):
    if os.environ.get("DEEPINFER_REQUIRE_VLLM") == "1":
        import importlib

        return importlib.import_module(name)
    return pytest.importorskip(name)


@pytest.fixture(scope="module")
def vllm_compress():
    return _import_vllm(f"{_V41_OPS}.fused_compress_quant_cache")


@pytest.fixture(scope="module")
def vllm_indexer():
    return _import_vllm(f"{_V41_OPS}.indexer_k_store")


# ------------------------------------------------------------------ interpreter casts


@contextlib.contextmanager
def gpu_casts():
    """Make the interpreter's fp32->fp8e4nv and fp32->bf16 casts the GPU's.

    ``cvt.rn.satfinite.e4m3x2.f32``: nearest even, saturating at +-448, NaN -> 0x7F;
    ``cvt.rn.bf16.f32``: nearest even, NaN -> 0x7FFF. Other casts are left alone.
    """
    import triton.runtime.interpreter as interp

    original = interp._convert_float

    def convert(data, src, dst, rounding_mode):
        if src != tl.float32 or dst not in (tl.float8e4nv, tl.bfloat16):
            return original(data, src, dst, rounding_mode)
        x = torch.from_numpy(np.array(data, dtype=np.float32).reshape(-1))
        if dst == tl.bfloat16:
            out = bf16_bits_ref(x).numpy().view(np.uint16)
        else:
            clamped = torch.where(torch.isnan(x), x, x.clamp(-448.0, 448.0))
            out = clamped.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            out = np.where(np.isnan(x.numpy()), np.uint8(0x7F), out)
        return out.reshape(np.shape(data))

    interp._convert_float = convert
    try:
        yield
    finally:
        interp._convert_float = original


@triton.jit
def _casts_kernel(x_ptr, fp8_ptr, bf16_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(x_ptr + o)
    tl.store(fp8_ptr + o, x.to(tl.float8e4nv).to(tl.uint8, bitcast=True))
    tl.store(bf16_ptr + o, x.to(tl.bfloat16))


@cpu_only
def test_interpreter_casts_are_not_the_gpus():
    """Why vLLM's writers need ``gpu_casts`` to be oracles (and why ours avoid casts)."""
    x = torch.tensor(
        [
            1.0625,  # e4m3 tie between 1.0 and 1.125: nearest even is 1.0 (0x38)
            1.97,  # rounds up into the next binade: 2.0 (0x40)
            2.0**-8,  # e4m3 subnormal 0x02
            1.0 + 2.0**-8 + 2.0**-20,  # just above a bf16 tie: rounds up
            1.0 + 3 * 2.0**-8,  # bf16 tie: nearest even rounds up to 1 + 2**-6
            3.0,
            -0.0,
            0.5,
        ]
    )
    want_fp8 = x.to(torch.float8_e4m3fn).view(torch.uint8)
    want_bf16 = x.to(torch.bfloat16).view(torch.int16)
    fp8 = torch.zeros(8, dtype=torch.uint8)
    bf16 = torch.zeros(8, dtype=torch.bfloat16)
    _casts_kernel[(1,)](x, fp8, bf16, N=8)
    assert not torch.equal(fp8, want_fp8)
    assert not torch.equal(bf16.view(torch.int16), want_bf16)
    with gpu_casts():
        _casts_kernel[(1,)](x, fp8, bf16, N=8)
    assert torch.equal(fp8, want_fp8)
    assert torch.equal(bf16.view(torch.int16), want_bf16)


# ------------------------------------------------------------------ device helpers


@triton.jit
def _helpers_kernel(x_ptr, exp_ptr, bits_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m, other=1.0)
    tl.store(exp_ptr + o, ue8m0_exponent(x), mask=m)
    tl.store(bits_ptr + o, bf16_rne_bits(x), mask=m)


def _run_helpers(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    exp = torch.full(x.shape, 12345.0)
    bits = torch.zeros(x.shape, dtype=torch.int16)
    block = 8192
    _helpers_kernel[(triton.cdiv(x.numel(), block),)](x, exp, bits, x.numel(), BLOCK=block)
    return exp, bits


@cpu_only
def test_ue8m0_exponent_is_exact_for_every_bf16_amax():
    """vLLM's fp32 formula ceil(log2f(amax * fl(1/448))) equals the exact exponent the
    reference computes, for every finite positive bf16 amax (the writers' inputs are
    bf16), both sides of the 1e-4 floor, and inf."""
    bits = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16)
    amax = bits.view(torch.bfloat16).float()
    amax = torch.cat([amax, torch.tensor([1e-4, float("inf"), 0.0, float("nan")])])
    got, _ = _run_helpers(amax)
    want = ue8m0_exponent_ref(amax)
    assert torch.equal(got, want), (got != want).nonzero()[:5]
    assert want[-4:].tolist() == [-22.0, float("inf"), -22.0, -22.0]
    # 448 * 2**j keeps exponent j; the next bf16 up takes j + 1.
    assert ue8m0_exponent_ref(torch.tensor([448.0, 449.75, 446.0])).tolist() == [0, 1, 0]


@cpu_only
def test_bf16_rounding_matches_torch():
    g = torch.Generator().manual_seed(0)
    rand_bits = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=g, dtype=torch.int64)
    x = rand_bits.to(torch.int32).view(torch.float32)
    ties = (torch.arange(-4096, 4096, dtype=torch.int32) * 0x10000 + 0x8000).view(torch.float32)
    special = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 3.4e38, -3.4e38, 1e-40, -1e-45]
    )
    x = torch.cat([x, ties, special])
    _, got = _run_helpers(x)
    want = bf16_bits_ref(x)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ, first x bits {x[bad[0]].view(torch.int32)}"
    assert got[-5] == 0x7FFF  # NaN, as cvt.rn.bf16.f32 writes it


def test_quantizer_equals_kv_cache_reference_encoder():
    """One UE8M0/e4m3 rule for every V4 writer: ours is kv_cache's (finite inputs)."""
    k = torch.cat([_edge_latents(), _latents(40, seed=11)])
    data, scales = encode_records_ref(k)
    q, e = ue8m0_e4m3_quantize_ref(k[:, :448].float().view(-1, 7, 64))
    assert torch.equal(q.view(-1, 448), data[:, :448])
    assert torch.equal(scale_bytes_ref(e), scales[:, :7])


# ------------------------------------------------------------------ inputs


def _latents(n: int, seed: int) -> torch.Tensor:
    """bf16 rows with a wide range across rows and outliers within groups, so small
    members become e4m3 subnormals or signed zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 512, generator=g)
    if n > 1:
        x *= torch.logspace(-5, 5, n)[:, None]
    spikes = torch.rand(n, 512, generator=g) < 0.02
    return torch.where(spikes, x * 300, x).to(torch.bfloat16)


def _edge_latents() -> torch.Tensor:
    """Group maxima on, above and below 448 * 2**j; e4m3 ties (1.0625 * 2**-j at scale
    2**-j); carries into the next binade; zeros, signed zeros, sub-floor values."""
    rows = []
    base = torch.linspace(-1, 1, 512)
    for j in (-14, 0, 5):
        for amax in (448.0, 449.75, 446.0):
            rows.append(base * amax * 2.0**j)
        tie = torch.full((512,), 1.0625 * 2.0**j)
        tie[::64] = 448.0 * 2.0**j
        tie[1::2] = 1.97 * 2.0**j  # 1.97 rounds up to 2.0
        rows.append(tie)
    rows.append(torch.zeros(512))
    rows.append(-torch.zeros(512))
    rows.append(torch.full((512,), 3e-6))
    rows.append(torch.where(torch.arange(512) % 2 == 0, -0.0, -5.0))
    return torch.stack(rows).to(torch.bfloat16)


def _rope_table(max_pos: int = 4096, theta: float = 160000.0) -> torch.Tensor:
    inv_freq = 1.0 / theta ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _slots_positions(n: int, num_slots: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_slots, generator=g)[:n]
    slots[torch.rand(n, generator=g) < 0.15] = -1
    positions = torch.randint(0, 4000, (n,), generator=g)
    return slots, positions


def _index_cache(num_blocks: int, block_size: int, pad: int = 0) -> torch.Tensor:
    stride = index_page_bytes(block_size) + pad
    flat = torch.full((num_blocks * stride,), 0xFF, dtype=torch.uint8)
    return flat.as_strided(
        (num_blocks, block_size, INDEX_RECORD_BYTES), (stride, INDEX_RECORD_BYTES, 1)
    )


def _plain_cache(num_blocks: int, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Plain rows 640 elements apart in padded pages (both strides are honoured)."""
    page = block_size * 640 + 64
    flat = torch.full((num_blocks * page * dtype.itemsize,), 0xFF, dtype=torch.uint8)
    return flat.view(dtype).as_strided((num_blocks, block_size, 512), (page, 640, 1))


def _raw(cache: torch.Tensor) -> torch.Tensor:
    """Every byte of a paged cache, page padding included, as ``[num_blocks, bytes]``."""
    flat = cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def _assert_same_bytes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    a, b = _raw(got), _raw(want)
    diff = (a != b).nonzero()
    assert diff.numel() == 0, (
        f"{what}: {diff.shape[0]} bytes differ, first at page/byte {diff[0].tolist()}: "
        f"got {int(a[tuple(diff[0])]):#04x}, want {int(b[tuple(diff[0])]):#04x}"
    )


# ------------------------------------------------------------------ signatures


def test_signatures_equal_vllm(vllm_compress, vllm_indexer):
    assert inspect.signature(rope_quant_insert) == inspect.signature(
        vllm_compress.rope_quant_insert
    )
    assert inspect.signature(indexer_k_norm_rope_store) == inspect.signature(
        vllm_indexer.indexer_k_norm_rope_store
    )


# ------------------------------------------------------------------ compressed KV: V4 record


@cpu_only
@pytest.mark.parametrize(
    "ratio,block_size,num_tokens",
    [(1, 64, 37), (2, 32, 33), (1, 128, 1), (2, 64, 7), (1, 256, 18)],
)
def test_compressed_v4_record_equals_vllm_and_ref(vllm_compress, ratio, block_size, num_tokens):
    """Production record (448 NoPE + 64 RoPE, 584 B) at vLLM's compressed block sizes
    (kv block 64/128/256 divided by the ratio), -1 slots, skipped group members, page
    padding and DP-padding rows beyond the slot mapping."""
    latent = torch.cat([_edge_latents(), _latents(num_tokens, seed=num_tokens)])[:num_tokens]
    latent = torch.cat([latent, torch.full((3, 512), float("nan"), dtype=torch.bfloat16)])
    num_blocks = -(-num_tokens // block_size) + 2
    slots, positions = _slots_positions(num_tokens, num_blocks * block_size, seed=ratio)
    positions = torch.cat([positions, torch.zeros(3, dtype=torch.int64)])
    cos_sin = _rope_table()
    stride = page_bytes(block_size) + 576
    ours, theirs, ref = (paged_cache(num_blocks, block_size, page_bytes=stride) for _ in range(3))
    rope_quant_insert(latent, positions, cos_sin, ours, slots, ratio)
    with gpu_casts():
        vllm_compress.rope_quant_insert(latent, positions, cos_sin, theirs, slots, ratio)
    rope_quant_insert_ref(latent, positions, cos_sin, ref, slots, ratio)
    _assert_same_bytes(ours, theirs, "vs vLLM")
    _assert_same_bytes(ours, ref, "vs ref")
    writers = [
        i for i in range(num_tokens) if slots[i] >= 0 and (int(positions[i]) + 1) % ratio == 0
    ]
    assert int((_raw(ours) != 0xFF).sum()) > 0 or not writers
    # Nothing outside the written records changed (padding, other slots).
    data, scales = page_views(ours, block_size)
    untouched = torch.ones(num_blocks, block_size, dtype=torch.bool)
    for i in writers:
        untouched[int(slots[i]) // block_size, int(slots[i]) % block_size] = False
    assert (data[untouched] == 0xFF).all() and (scales[untouched] == 0xFF).all()
    assert (cache_bytes(ours)[:, block_size * RECORD_BYTES :] == 0xFF).all()
    assert (scales[~untouched][:, 7] == 0).all()


@cpu_only
def test_compressed_v4_record_equals_unpatched_vllm_on_exact_inputs(vllm_compress):
    """Without touching the interpreter: inputs whose scaled values are exact in e4m3
    and whose RoPE is the identity leave no rounding to do, so vLLM's kernel as written
    is an oracle too."""
    g = torch.Generator().manual_seed(5)
    e4m3_values = torch.arange(0, 0x7F).to(torch.uint8).view(torch.float8_e4m3fn).float()
    pick = torch.randint(0, e4m3_values.numel(), (9, 512), generator=g)
    sign = torch.where(torch.rand(9, 512, generator=g) < 0.5, -1.0, 1.0)
    # Each group's max is 448 * 2**j, so its scale is 2**j and every value lands on e4m3.
    row_scale = 2.0 ** torch.randint(-10, 10, (9, 1), generator=g).float()
    latent = e4m3_values[pick] * sign * row_scale
    latent[:, ::64] = 448.0 * row_scale
    latent = latent.to(torch.bfloat16)
    identity = torch.cat([torch.ones(64, 32), torch.zeros(64, 32)], dim=1)
    positions = torch.arange(9)
    slots = torch.tensor([3, -1, 0, 5, 6, 7, 1, 2, 4])
    ours, theirs = paged_cache(1, 8), paged_cache(1, 8)
    rope_quant_insert(latent, positions, identity, ours, slots, 1)
    vllm_compress.rope_quant_insert(latent, positions, identity, theirs, slots, 1)
    _assert_same_bytes(ours, theirs, "vs unpatched vLLM")


def test_compressed_nonfinite_latents(device):
    """NaN / inf follow vLLM's GPU code: a NaN value is stored as +448 (0x7E) and does
    not set the group scale; an infinite value makes the scale byte 255 and the group's
    finite values signed zeros; NaN RoPE values are stored as bf16 0x7FFF."""
    latent = _latents(4, seed=2)
    latent[0, 5] = float("nan")
    latent[1, 64:128] = float("nan")  # a whole NaN group: the 1e-4 floor sets its scale
    latent[2, 130] = float("inf")
    latent[3, 449] = float("nan")  # RoPE pair (448, 449): both outputs NaN
    latent[3, 500] = -float("inf")
    cos_sin = _rope_table()
    positions = torch.tensor([10, 11, 12, 13])
    slots = torch.tensor([0, 1, 2, 3])
    ours = move_cache(paged_cache(1, 64), device)
    rope_quant_insert(
        latent.to(device), positions.to(device), cos_sin.to(device), ours, slots.to(device), 1
    )
    ours = move_cache(ours, "cpu")
    if not ON_GPU:  # on a GPU the finite RoPE values go through FMA: not the ref's rounding
        ref = paged_cache(1, 64)
        rope_quant_insert_ref(latent, positions, cos_sin, ref, slots, 1)
        _assert_same_bytes(ours, ref, "vs ref")
    data, scales = page_views(ours, 64)
    assert data[0, 0, 5] == 0x7E and data[0, 1, 64:128].eq(0x7E).all()
    assert scales[0, 1, 1] == 127 - 22
    assert scales[0, 2, 2] == 255 and data[0, 2, 130] == 0x7E
    assert set(data[0, 2, 128:192].tolist()) <= {0x00, 0x80, 0x7E}
    rope = data[0, 3, 448:].view(torch.int16)
    assert rope[0] == 0x7FFF and rope[1] == 0x7FFF


# ------------------------------------------------------------------ compressed KV: plain rows


@cpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("ratio", [1, 2])
def test_compressed_plain_rows_equal_vllm_and_ref(vllm_compress, dtype, ratio):
    latent = torch.cat([_edge_latents()[:6], _latents(7, seed=3)])
    n = latent.shape[0]
    slots, positions = _slots_positions(n, 64, seed=ratio + 7)
    cos_sin = _rope_table()
    fp8_scale = torch.tensor([0.37], dtype=torch.float32) if dtype != torch.bfloat16 else None
    if fp8_scale is not None:
        latent = (latent.float().clamp(-300, 300)).to(torch.bfloat16)
    ours, theirs, ref = (_plain_cache(2, 32, dtype) for _ in range(3))
    rope_quant_insert(latent, positions, cos_sin, ours, slots, ratio, fp8_scale=fp8_scale)
    with gpu_casts():
        vllm_compress.rope_quant_insert(
            latent, positions, cos_sin, theirs, slots, ratio, fp8_scale=fp8_scale
        )
    rope_quant_insert_ref(latent, positions, cos_sin, ref, slots, ratio, fp8_scale=fp8_scale)
    _assert_same_bytes(ours, theirs, "vs vLLM")
    _assert_same_bytes(ours, ref, "vs ref")


# ------------------------------------------------------------------ indexer K


def _exact_k_pre(n: int, seed: int) -> torch.Tensor:
    """bf16 rows of small integers times a per-row power of two: the fp32 sum of
    squares is exact in any order, so the reference's norm equals the kernel's."""
    g = torch.Generator().manual_seed(seed)
    ints = torch.randint(-40, 41, (n, 128), generator=g).float()
    ints[:, 7] = 40.0  # no all-zero row
    return (ints * 2.0 ** torch.randint(-12, 8, (n, 1), generator=g)).to(torch.bfloat16)


def _random_k_pre(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 128, generator=g) * torch.logspace(-3, 3, n)[:, None]
    return torch.where(torch.rand(n, 128, generator=g) < 0.03, x * 40, x).to(torch.bfloat16)


def _norm_weight(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (1 + 0.2 * torch.randn(128, generator=g)).to(torch.bfloat16)


def _store_keys_on(device, k_pre, positions, cos_sin, weight, cache, slots, ratio=1) -> None:
    """``indexer_k_norm_rope_store`` (eps 1e-6, FP8 cache) of CPU inputs into ``cache``,
    which is already on ``device``."""
    inputs = (t.to(device) for t in (k_pre, positions, cos_sin, weight))
    indexer_k_norm_rope_store(*inputs, 1e-6, cache, slots.to(device), ratio, False)


@cpu_only
@pytest.mark.parametrize(
    "ratio,block_size,num_tokens",
    [(1, 64, 37), (2, 32, 33), (1, 128, 1), (2, 64, 9), (1, 256, 17)],
)
def test_indexer_k_equals_vllm_and_ref(vllm_indexer, ratio, block_size, num_tokens):
    """Production geometry (head dim 128, RoPE dim 64, 132-byte records, 576-aligned
    pages plus padding) at the indexer block sizes vLLM uses, -1 slots, skipped group
    members, more k_pre rows than tokens."""
    num_blocks = -(-num_tokens // block_size) + 2
    slots, positions = _slots_positions(num_tokens, num_blocks * block_size, seed=ratio + 3)
    cos_sin = _rope_table()
    weight = _norm_weight(ratio)
    for k_pre in (_exact_k_pre(num_tokens + 2, 1), _random_k_pre(num_tokens + 2, 2)):
        ours, theirs = (
            _index_cache(num_blocks, block_size, 64),
            _index_cache(num_blocks, block_size, 64),
        )
        args = (k_pre, positions, cos_sin, weight, 1e-6)
        indexer_k_norm_rope_store(*args, ours, slots, ratio, False)
        with gpu_casts():
            vllm_indexer.indexer_k_norm_rope_store(*args, theirs, slots, ratio, False)
        _assert_same_bytes(ours, theirs, "vs vLLM")
    # The reference on the exactly-summable rows (see _exact_k_pre).
    k_pre = _exact_k_pre(num_tokens + 2, 1)
    ours, ref = _index_cache(num_blocks, block_size, 64), _index_cache(num_blocks, block_size, 64)
    indexer_k_norm_rope_store(k_pre, positions, cos_sin, weight, 1e-6, ours, slots, ratio, False)
    indexer_k_store_ref(k_pre, positions, cos_sin, weight, 1e-6, ref, slots, ratio)
    _assert_same_bytes(ours, ref, "vs ref")
    # Untouched: padding and every record no token published.
    values, scales = indexer_page_views(ours)
    written = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for i in range(num_tokens):
        if slots[i] >= 0 and (int(positions[i]) + 1) % ratio == 0:
            written[int(slots[i]) // block_size, int(slots[i]) % block_size] = True
    assert (values[~written] == 0xFF).all() and (scales[~written] == 0xFF).all()
    assert (cache_bytes(ours)[:, block_size * INDEX_RECORD_BYTES :] == 0xFF).all()


def test_indexer_k_decodes_to_the_normalized_rotated_key(device):
    """Values x scale decode to the reference key within e4m3's half step."""
    k_pre = _random_k_pre(16, 4)
    cos_sin, weight = _rope_table(), _norm_weight(4)
    positions, slots = torch.arange(16) * 3 + 1, torch.arange(16)
    cache = _index_cache(1, 16)
    dev_cache = move_cache(cache, device)
    _store_keys_on(device, k_pre, positions, cos_sin, weight, dev_cache, slots)
    values, scales = indexer_page_views(move_cache(dev_cache, "cpu"))
    scale = scales[0].contiguous().view(torch.float32)
    back = e4m3_decode_ref(values[0]) * scale
    key = indexer_k_rows_ref(k_pre, positions, cos_sin, weight, 1e-6, 1)
    tol = torch.maximum(key.abs() * 2**-4, scale * 2**-10) * 1.01 + key.abs() * 2**-7
    assert ((back - key).abs() <= tol).all()
    assert torch.equal(torch.log2(scale), torch.round(torch.log2(scale)))  # powers of two


@cpu_only
def test_indexer_k_strided_rows_and_int32_indices(vllm_indexer):
    """k_pre as a view into a wider buffer; int32 positions and slots."""
    wide = torch.cat([_random_k_pre(11, 6), _random_k_pre(11, 7)], dim=1)
    k_pre = wide[:, 128:]
    positions = torch.arange(11, dtype=torch.int32) * 5
    slots = torch.arange(11, dtype=torch.int32)
    slots[4] = -1
    cos_sin, weight = _rope_table(), _norm_weight(1)
    ours, theirs = _index_cache(1, 64), _index_cache(1, 64)
    indexer_k_norm_rope_store(k_pre, positions, cos_sin, weight, 1e-5, ours, slots, 1, False)
    with gpu_casts():
        vllm_indexer.indexer_k_norm_rope_store(
            k_pre, positions, cos_sin, weight, 1e-5, theirs, slots, 1, False
        )
    _assert_same_bytes(ours, theirs, "vs vLLM")


def test_indexer_k_nonfinite_rows(device):
    """A NaN row stores 0x7E everywhere with the floor scale 2**-22 (vLLM's GPU code:
    NaN-ignoring maximum, clamp to +448)."""
    k_pre = _exact_k_pre(3, 9)
    k_pre[0, 3] = float("nan")
    k_pre[2, 70] = float("inf")
    cos_sin, weight = _rope_table(), _norm_weight(9)
    positions, slots = torch.tensor([4, 5, 6]), torch.tensor([2, 0, 1])
    ours = move_cache(_index_cache(1, 8), device)
    _store_keys_on(device, k_pre, positions, cos_sin, weight, ours, slots)
    ours = move_cache(ours, "cpu")
    if not ON_GPU:  # on a GPU the norm uses rsqrt.approx: not the ref's rounding
        ref = _index_cache(1, 8)
        indexer_k_store_ref(k_pre, positions, cos_sin, weight, 1e-6, ref, slots, 1)
        _assert_same_bytes(ours, ref, "vs ref")
    values, scales = indexer_page_views(ours)
    assert values[0, 2].eq(0x7E).all()
    assert scales[0, 2].contiguous().view(torch.float32).item() == 2.0**-22


# ------------------------------------------------------------------ corner cases, errors


def test_zero_tokens_and_all_skipped_write_nothing(device):
    cos_sin = _rope_table(64).to(device)
    for n_rows in (0, 4):
        latent = _latents(max(n_rows, 1), 0)[:n_rows].to(device)
        k_pre = _random_k_pre(max(n_rows, 1), 0)[:n_rows].to(device)
        positions = torch.arange(n_rows, device=device)
        slots = torch.full((n_rows,), -1, dtype=torch.int64, device=device)
        kv = move_cache(paged_cache(1, 32), device)
        idx = move_cache(_index_cache(1, 32), device)
        rope_quant_insert(latent, positions, cos_sin, kv, slots, 1)
        indexer_k_norm_rope_store(
            k_pre, positions, cos_sin, _norm_weight(0).to(device), 1e-6, idx, slots, 1, False
        )
        assert (cache_bytes(kv) == 0xFF).all() and (cache_bytes(idx) == 0xFF).all()
    # Ratio 2: tokens at even positions close no group and write nothing.
    kv = move_cache(paged_cache(1, 32), device)
    positions = torch.tensor([0, 2, 4], device=device)
    slots = torch.tensor([0, 1, 2], device=device)
    rope_quant_insert(_latents(3, 1).to(device), positions, cos_sin, kv, slots, 2)
    assert (cache_bytes(kv) == 0xFF).all()


def test_errors_name_the_argument():
    latent, positions = _latents(2, 0), torch.arange(2)
    slots, cos_sin = torch.arange(2), _rope_table(8)
    kv = paged_cache(1, 32)
    cases = [
        (dict(kv_cache=torch.zeros(1, 32, 528, dtype=torch.uint8)), "SM100 only"),
        (dict(kv_cache=torch.zeros(1, 32, 288, dtype=torch.uint8)), "SM100 only"),
        (dict(kv_cache=torch.zeros(1, 32, 576, dtype=torch.uint8)), "584-byte V4"),
        (dict(kv_cache=torch.zeros(1, 32, 512, dtype=torch.float16)), "kv_cache: expected"),
        (dict(kv_cache=torch.zeros(1, 32, 512, dtype=torch.float8_e4m3fn)), "fp8_scale"),
        (dict(latent=latent.float()), r"latent: expected dtype torch\.bfloat16"),
        (dict(latent=latent[:, :448]), r"latent: expected \[T, 512\]"),
        (dict(slot_mapping=torch.arange(3)), "slot_mapping: maps 3 tokens"),
        (dict(compress_ratio=4), "compress_ratio: expected 1 or 2"),
        (dict(cos_sin_cache=cos_sin[:, :32]), "cos_sin_cache: expected"),
        (dict(positions=positions.float()), "positions: expected dtype"),
    ]
    base = dict(
        latent=latent,
        positions=positions,
        cos_sin_cache=cos_sin,
        kv_cache=kv,
        slot_mapping=slots,
        compress_ratio=1,
    )
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            rope_quant_insert(**{**base, **change})

    k_pre = _random_k_pre(2, 0)
    ibase = dict(
        k_pre=k_pre,
        positions=positions,
        cos_sin_cache=cos_sin,
        rms_norm_weight=_norm_weight(0),
        rms_norm_eps=1e-6,
        k_cache=_index_cache(1, 32),
        kv_slot_mapping=slots,
        compress_ratio=1,
        use_fp4_cache=False,
    )
    icases = [
        (dict(use_fp4_cache=True), "use_fp4_cache: .*sm_100"),
        (dict(k_cache=torch.zeros(1, 32, 68, dtype=torch.uint8)), "MXFP4 indexer cache"),
        (dict(k_cache=torch.zeros(1, 32, 128, dtype=torch.uint8)), "132-byte FP8"),
        (dict(k_pre=k_pre[:, :64]), r"k_pre: expected \[T, 128\]"),
        (dict(rms_norm_weight=torch.ones(64)), "rms_norm_weight: expected 128"),
        (dict(kv_slot_mapping=torch.arange(5)), "kv_slot_mapping: maps 5 tokens"),
        (dict(compress_ratio=0), "compress_ratio"),
    ]
    for change, message in icases:
        with pytest.raises(ValueError, match=message):
            indexer_k_norm_rope_store(**{**ibase, **change})


# ------------------------------------------------------------------ full size (GPU tier)

FULL_SIZE_TOKENS = 16384  # max_num_batched_tokens of the V4.1 recipes


@pytest.mark.gpu
@pytest.mark.parametrize("ratio,block_size", [(1, 128), (2, 64)])
def test_full_size_writers_on_gpu(device, ratio, block_size):
    """16K tokens. NoPE bytes and scales are exact against the reference on any GPU
    (no rounding-mode freedom there); RoPE goes through FMA on the GPU, so it is within
    one bf16 ulp of the unfused reference. The indexer key decodes within e4m3's step."""
    n = FULL_SIZE_TOKENS
    num_blocks = n // block_size + 2
    latent = _latents(n, 1)
    slots, positions = _slots_positions(n, num_blocks * block_size, seed=1)
    cos_sin = _rope_table(8192)
    kv = move_cache(paged_cache(num_blocks, block_size), device)
    rope_quant_insert(
        *(t.to(device) for t in (latent, positions, cos_sin)), kv, slots.to(device), ratio
    )
    ref = paged_cache(num_blocks, block_size)
    rope_quant_insert_ref(latent, positions, cos_sin, ref, slots, ratio)
    got_d, got_s = page_views(move_cache(kv, "cpu"), block_size)
    want_d, want_s = page_views(ref, block_size)
    assert torch.equal(got_d[..., :448], want_d[..., :448]) and torch.equal(got_s, want_s)
    got_rope = got_d[..., 448:].contiguous().view(torch.int16).int()
    want_rope = want_d[..., 448:].contiguous().view(torch.int16).int()
    assert (got_rope - want_rope).abs().max() <= 1

    k_pre, weight = _random_k_pre(n, 3), _norm_weight(3)
    idx = move_cache(_index_cache(num_blocks, block_size), device)
    _store_keys_on(device, k_pre, positions, cos_sin, weight, idx, slots, ratio)
    values, scales = indexer_page_views(move_cache(idx, "cpu"))
    key = indexer_k_rows_ref(k_pre, positions, cos_sin, weight, 1e-6, ratio)
    for i in range(0, n, 97):
        s = int(slots[i])
        if s < 0 or (int(positions[i]) + 1) % ratio:
            continue
        scale = scales[s // block_size, s % block_size].contiguous().view(torch.float32)
        back = e4m3_decode_ref(values[s // block_size, s % block_size]) * scale
        tol = torch.maximum(key[i].abs() * 2**-4, scale * 2**-10) * 1.01 + key[i].abs() * 2**-6
        assert ((back - key[i]).abs() <= tol).all()


# ------------------------------------------------------------------ Ampere fitness (AOT)


def _vllm_spec(label: str, kernel: str, signature: dict, constexprs: dict, warps: int):
    return KernelSpec(
        label=label,
        kernel=f"{_V41_OPS}.{kernel}",
        signature=signature,
        constexprs=constexprs,
        num_warps=warps,
    )


def _vllm_specs() -> list[KernelSpec]:
    """vLLM's writers (expected to fail on sm_80: fp8e4nv) and the state kernels on the
    same path (expected to compile as they are)."""
    rope = {"latent": "*bf16", "positions": "*i64", "cos_sin": "*fp32", "cache_slots": "*i64"}
    geometry = {"COS_STRIDE": 64, "CACHE_BLOCK": 64, "COMPRESS_RATIO": 1}
    save = {
        "raw": "*fp32",
        "positions": "*i64",
        "state_slots": "*i64",
        "norm_weight": "*bf16",
        "latent": "*bf16",
        "prev_rows": "*fp32",
        "prev_row_indices": "*i64",
        "num_tokens": "i32",
        "num_reqs": "i32",
    }
    save_cr2 = {**save, "state": "*fp32", "query_start_loc": "*i32", "req_ids": "*i32"}
    save_common = {"PREV_ROW_STRIDE": 1024, "EPS": 1e-6, "JOIN_ROW_PTRS": True}
    ring = {"STATE_STRIDE": 8 * 1024, "STATE_ROW_STRIDE": 1024, "STATE_BLOCK": 8}
    idx_sig = {
        "k_pre_ptr": "*bf16",
        "k_pre_stride": "i32",
        "positions_ptr": "*i64",
        "rms_norm_weight_ptr": "*bf16",
        "rms_norm_eps": "fp32",
        "cos_sin_cache_ptr": "*fp32",
        "cos_sin_stride": "i32",
        "k_cache_ptr": "*u8",
        "kv_slot_mapping_ptr": "*i64",
        "kv_cache_block_size": "i32",
    }
    idx_const = {
        "HEAD_SIZE": 128,
        "ROPE_HEAD_DIM": 64,
        "COMPRESS_RATIO": 1,
        "TOKEN_STRIDE": 128,
        "SCALE_DIM": 4,
        "KV_BLOCK_STRIDE": index_page_bytes(64),
        "FP8_MAX": 448.0,
        "USE_FP4": False,
        "MX_SCALE": False,
        "SHUFFLE": False,
        "BLOCK_TILE_SIZE": 16,
        "HEAD_TILE_SIZE": 16,
    }
    fcq = "fused_compress_quant_cache"
    return [
        _vllm_spec(
            "vllm.rope_quant_insert[v4]",
            f"{fcq}:_rope_quant_insert_kernel",
            {**rope, "cache": "*u8"},
            {**geometry, "CACHE_STRIDE": page_bytes(64), "SANITIZE_CACHE_NANS": False},
            4,
        ),
        _vllm_spec(
            "vllm.indexer_k_store[fp8]",
            "indexer_k_store:_indexer_k_norm_rope_quant_store_kernel",
            idx_sig,
            idx_const,
            1,
        ),
        _vllm_spec(
            "vllm.rope_plain_insert[bf16]",
            f"{fcq}:_rope_plain_insert_kernel",
            {**rope, "cache": "*bf16"},
            {
                **geometry,
                "fp8_scale": None,
                "CACHE_STRIDE": 64 * 512,
                "ROW_STRIDE": 512,
                "STORE_FP8": False,
            },
            4,
        ),
        _vllm_spec(
            "vllm.fused_save_compress_norm[cr1]",
            f"{fcq}:_fused_save_compress_norm_kernel",
            save,
            {
                **save_common,
                "state": None,
                "query_start_loc": None,
                "req_ids": None,
                "RAW_STRIDE": 512,
                "STATE_STRIDE": 1,
                "STATE_ROW_STRIDE": 1,
                "STATE_BLOCK": 1,
                "COMPRESS_RATIO": 1,
                "HAS_PREV_ROWS": False,
            },
            4,
        ),
        *(
            _vllm_spec(
                f"vllm.fused_save_compress_norm[cr2,prev={int(prev)}]",
                f"{fcq}:_fused_save_compress_norm_kernel",
                save_cr2,
                {
                    **save_common,
                    **ring,
                    "RAW_STRIDE": 1024,
                    "COMPRESS_RATIO": 2,
                    "HAS_PREV_ROWS": prev,
                },
                4,
            )
            for prev in (False, True)
        ),
        _vllm_spec(
            "vllm.save_ring_rows",
            f"{fcq}:_save_ring_rows_kernel",
            {"rows": "*fp32", "slot_mapping": "*i64", "state": "*fp32"},
            {**ring, "ROW_STRIDE": 1024},
            4,
        ),
    ]


def test_specs_cover_every_writer_ratio_and_plain_format():
    """The Ampere-fit tier (tests/test_ampere_fit.py) checks only what is listed here."""
    assert sorted(s.label for s in ampere_kernel_specs()) == sorted(
        f"cache_writers.{name}[cr={ratio}{extra}]"
        for ratio in (1, 2)
        for name, extra in (
            ("indexer_k", ""),
            ("compressed_kv", ""),
            ("plain_rows", ",fp8=0"),
            ("plain_rows", ",fp8=1"),
        )
    )


@pytest.mark.aot
def test_vllm_writers_need_replacing_and_state_kernels_do_not(vllm_compress):
    """On sm_80 vLLM's V4-record and indexer writers fail to compile (fp8e4nv), while
    its plain bf16 writer, fused_save_compress_norm and save_ring_rows compile as they
    are (so they are not replaced)."""
    reports = compile_for_ampere(_vllm_specs(), ccs=[80])
    print("\n" + format_reports(reports))
    by_label = {r.label: r for r in reports}
    for label in ("vllm.rope_quant_insert[v4]", "vllm.indexer_k_store[fp8]"):
        assert by_label[label].error and "fp8e4nv" in by_label[label].error, by_label[label]
    for label, r in by_label.items():
        if label not in ("vllm.rope_quant_insert[v4]", "vllm.indexer_k_store[fp8]"):
            assert r.error is None, f"{label}: {r.error}"
