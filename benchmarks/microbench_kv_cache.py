"""The 584-byte V4 record: gather (dequantize) and insert (quantize) (suite ``kv_cache``).

Gather baseline: PyTorch decode (``float8_e4m3fn`` view, ``exp2`` scales) into a
temporary, then ``.copy_()`` into the workspace -- the path the original's 4.02x (16K)
and 7.64x (48K) were measured against. Gate: >= 70% of the device copy bandwidth
measured in the same run, counting 584 B read + 1,024 B written per row.

Insert baseline: the PyTorch encoder (clamp + ``float8_e4m3fn``) and an ``index_put``;
both sides must write the same bytes.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.microbench_kv_cache``
"""

import sys

import torch

from benchmarks.runner import Case, Gate, Registry, exact_check, main_for_suite
from deepinfer_sm80.ops.kv_cache import dequantize_and_gather_k_cache, quantize_and_insert_k_cache
from deepinfer_sm80.ops.kv_cache.layout import NOPE_DIM, RECORD_BYTES, page_bytes
from deepinfer_sm80.ops.kv_cache.ref import encode_records_ref, page_views

SUITE = "kv_cache"


def random_cache(num_blocks: int, block_size: int, seed: int) -> torch.Tensor:
    """A paged cache of random, well-formed V4 records on the GPU (e4m3 NoPE bytes below
    0x7E with random signs, bf16 RoPE, UE8M0 scales 105-139), page stride as vLLM's."""
    stride = page_bytes(block_size)
    flat = torch.zeros(num_blocks * stride, dtype=torch.uint8, device="cuda")
    cache = flat.as_strided((num_blocks, block_size, RECORD_BYTES), (stride, RECORD_BYTES, 1))
    g = torch.Generator(device="cuda").manual_seed(seed)
    data, scales = page_views(cache, block_size)
    nope = torch.randint(0, 0x7E, data[..., :NOPE_DIM].shape, device="cuda", generator=g)
    sign = torch.randint(0, 2, nope.shape, device="cuda", generator=g) << 7
    data[..., :NOPE_DIM] = (nope | sign).to(torch.uint8)
    rope = torch.randn(*data.shape[:2], 64, device="cuda", generator=g).to(torch.bfloat16)
    data[..., NOPE_DIM:] = rope.view(torch.uint8)
    scales[..., :7] = torch.randint(105, 140, scales[..., :7].shape, device="cuda", generator=g).to(
        torch.uint8
    )
    scales[..., 7] = 0
    return cache


def gather_torch_temporary(out, cache, lens, gather_lens, block_table, block_size, offset):
    """PyTorch baseline: decode each request into a temporary, then ``.copy_()``."""
    data, scales = page_views(cache, block_size)
    for b, (seq_len, gather_len) in enumerate(zip(lens, gather_lens, strict=True)):
        pos = torch.arange(seq_len - gather_len, seq_len, device=cache.device)
        pages = block_table[b, pos // block_size].long()
        rows = pos % block_size
        rec, sc = data[pages, rows], scales[pages, rows]
        vals = rec[:, :NOPE_DIM].view(torch.float8_e4m3fn).float().view(-1, 7, 64)
        mult = torch.exp2(sc[:, :7].float() - 127.0)[..., None]
        nope = (vals * mult).view(-1, NOPE_DIM).to(torch.bfloat16)
        tmp = torch.cat([nope, rec[:, NOPE_DIM:].contiguous().view(torch.bfloat16)], dim=1)
        out[b, offset : offset + gather_len].copy_(tmp)
    return out


def _gather_case(registry: Registry, name: str, lens: list[int], block_size: int) -> None:
    pages = [-(-n // block_size) for n in lens]

    def setup():
        cache = random_cache(sum(pages) + 8, block_size, seed=sum(lens))
        perm = torch.randperm(sum(pages) + 8, device="cuda").int()
        table = torch.zeros(len(lens), max(pages), dtype=torch.int32, device="cuda")
        start = 0
        for b, n in enumerate(pages):
            table[b, :n] = perm[start : start + n]
            start += n
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        out_c = torch.full(
            (len(lens), max(lens), 512), float("nan"), dtype=torch.bfloat16, device="cuda"
        )
        out_b = out_c.clone()
        return cache, table, sl, out_c, out_b

    def candidate(state):
        cache, table, sl, out_c, _ = state
        dequantize_and_gather_k_cache(
            out_c, cache, sl, None, table, block_size, 0, max_gather_len=max(lens)
        )
        return out_c

    def baseline(state):
        cache, table, _, _, out_b = state
        return gather_torch_temporary(out_b, cache, lens, lens, table, block_size, 0)

    registry.add(
        Case(
            suite=SUITE,
            name=name,
            params={"lens": lens, "block_size": block_size},
            setup=setup,
            baseline_name="torch exp2-decode + temporary + copy_",
            baseline=baseline,
            candidate_name="deepinfer gather (software e4m3, bitshift UE8M0)",
            candidate=candidate,
            check=lambda s, b, c: exact_check(b, c),
            bytes_moved=lambda s: sum(lens) * (RECORD_BYTES + 1024),
            gates=[Gate("bandwidth_fraction_min", 0.70)],
        )
    )


def _insert_case(registry: Registry, T: int, block_size: int) -> None:
    def setup():
        g = torch.Generator(device="cuda").manual_seed(T)
        k = (torch.randn(T, 512, device="cuda", generator=g) * 3).to(torch.bfloat16)
        nb = -(-T // block_size) + 1
        slots = torch.randperm(nb * block_size, device="cuda")[:T]
        mk = lambda: random_cache(nb, block_size, seed=1)  # noqa: E731
        return k, slots, mk(), mk()

    def candidate(state):
        k, slots, cache_c, _ = state
        quantize_and_insert_k_cache(k, cache_c, slots, block_size)
        return cache_c.as_strided((cache_c.shape[0], cache_c.stride(0)), (cache_c.stride(0), 1))

    def baseline(state):
        k, slots, _, cache_b = state
        data, scales = page_views(cache_b, block_size)
        rec, sc = encode_records_ref(k)
        data[slots // block_size, slots % block_size] = rec
        scales[slots // block_size, slots % block_size] = sc
        return cache_b.as_strided((cache_b.shape[0], cache_b.stride(0)), (cache_b.stride(0), 1))

    registry.add(
        Case(
            suite=SUITE,
            name=f"insert_T{T}_bs{block_size}",
            params={"T": T, "block_size": block_size},
            setup=setup,
            baseline_name="torch encoder (clamp + float8_e4m3fn) + index_put",
            baseline=baseline,
            candidate_name="deepinfer insert (software e4m3 RNE)",
            candidate=candidate,
            check=lambda s, b, c: exact_check(b, c),
            bytes_moved=lambda s: T * (1024 + RECORD_BYTES),
        )
    )


def build_registry() -> Registry:
    registry = Registry()
    _gather_case(registry, "gather_16K", [16384], 64)
    _gather_case(registry, "gather_48K", [49152], 64)
    _gather_case(registry, "gather_4x16K_chunk", [16384, 16000, 12000, 16384], 64)
    _gather_case(registry, "gather_1M_ratio2_compressed", [524288], 32)
    for T in (1, 128, 4096):
        _insert_case(registry, T, 64)
    return registry


if __name__ == "__main__":
    sys.exit(main_for_suite(SUITE, build_registry()))
