"""Sparse MLA decode/prefill and the 584-byte V4 record gather/insert (suite ``kernels``).

Sparse MLA decode baseline: the original's baseline algorithm (separate NoPE/RoPE dots,
exp2 scale decode, a reduction launch always; ``baselines/sparse_mla_original.py``).
Targets: >= 50% of the device copy bandwidth at T=256; >= 1.3x at T <= 16. Prefill
baseline: a PyTorch gather + bmm + softmax path; TFLOP/s against this device's dense
bf16 matmul rate measured in the same run.

Gather baseline: PyTorch decode (``float8_e4m3fn`` view, ``exp2`` scales) into a
temporary, then ``.copy_()`` into the workspace -- the path the original's 4.02x (16K)
and 7.64x (48K) were measured against. Gate: >= 70% of the device copy bandwidth
measured in the same run, counting 584 B read + 1,024 B written per row.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.microbench_sparse_mla``
"""

import os
import sys

import torch

from benchmarks.baselines.sparse_mla_original import baseline_sparse_mla_decode
from benchmarks.runner import (
    Case,
    Gate,
    Registry,
    close_check,
    exact_check,
    main_for_suite,
    restored_env,
)
from deepinfer_sm80.ops.kv_cache import dequantize_and_gather_k_cache, quantize_and_insert_k_cache
from deepinfer_sm80.ops.kv_cache.layout import NOPE_DIM, RECORD_BYTES, page_bytes
from deepinfer_sm80.ops.kv_cache.ref import encode_records_ref, page_views
from deepinfer_sm80.ops.sparse_mla import sparse_mla_decode
from deepinfer_sm80.ops.sparse_mla.triton_kernel import (
    DECODE_SPLITS_ENV,
    decode_engine,
    prefill_engine,
    sparse_mla_prefill,
)

SUITE = "kernels"


def _random_cache(num_blocks: int, block_size: int, seed: int) -> torch.Tensor:
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
        cache = _random_cache(sum(pages) + 8, block_size, seed=sum(lens))
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
        mk = lambda: _random_cache(nb, block_size, seed=1)  # noqa: E731
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


SCALE = 512**-0.5


def _decode_case(
    registry: Registry,
    T: int,
    heads: int,
    main_width: int,
    extra_width: int,
    splits: str = "latency",
):
    """``splits``: DEEPINFER_SPARSE_MLA_DECODE_SPLITS for the candidate (the deployment's
    choice; ``throughput`` names the case with that suffix)."""
    name = f"mla_decode_T{T}_H{heads}_w{main_width}+{extra_width}"
    if splits != "latency":
        name += f"_{splits}"

    def setup():
        g = torch.Generator(device="cuda").manual_seed(T * 131 + heads)
        n_main = max(4096, 2 * main_width)
        n_extra = max(65536, 4 * extra_width)  # a long compressed history to pick from
        cache = _random_cache(-(-n_main // 256) + 1, 256, seed=1)
        extra = _random_cache(-(-n_extra // 64) + 1, 64, seed=2) if extra_width else None
        idx = torch.randint(0, n_main, (T, main_width), device="cuda", generator=g).int()
        lens = torch.full((T,), main_width, dtype=torch.int32, device="cuda")
        eidx = elens = None
        if extra_width:
            eidx = torch.randint(0, n_extra, (T, extra_width), device="cuda", generator=g).int()
            elens = torch.full((T,), extra_width, dtype=torch.int32, device="cuda")
        q = (torch.randn(T, 64, 512, device="cuda", generator=g) * 1.4).to(torch.bfloat16)
        sink = torch.randn(64, device="cuda", generator=g) + 4
        outs = [torch.empty_like(q), torch.empty_like(q)]
        return q, cache, idx, lens, sink, extra, eidx, elens, outs

    def candidate(st):
        q, cache, idx, lens, sink, extra, eidx, elens, outs = st
        with restored_env(DECODE_SPLITS_ENV):
            os.environ[DECODE_SPLITS_ENV] = splits
            sparse_mla_decode(
                q, cache, idx, lens, SCALE, sink, extra, eidx, elens, out=outs[0], num_heads=heads
            )
        return outs[0][:, :heads]

    def baseline(st):
        q, cache, idx, lens, sink, extra, eidx, elens, outs = st
        baseline_sparse_mla_decode(
            q, cache, idx, lens, SCALE, sink, extra, eidx, elens, outs[1], heads
        )
        return outs[1][:, :heads]

    rows = main_width + extra_width
    registry.add(
        Case(
            suite=SUITE,
            name=name,
            params={
                "T": T,
                "heads": heads,
                "main_width": main_width,
                "extra_width": extra_width,
                "splits": splits,
            },
            setup=setup,
            baseline_name="original baseline algorithm (separate NoPE/RoPE dots, exp2, reduce)",
            baseline=baseline,
            candidate_name=(
                "deepinfer decode, "
                + decode_engine(torch.device("cuda"))
                + f" kernel (DEEPINFER_SPARSE_MLA_DECODE picks), {splits} splits"
            ),
            candidate=candidate,
            check=lambda st, b, c: close_check(b, c, rel_tol=1e-2),
            # Records read once per token, q read and out written per real head.
            bytes_moved=lambda st: T * (rows * RECORD_BYTES + heads * 512 * 2 * 2),
            flops=lambda st: T * heads * rows * 512 * 4,
            # Issue targets: >= 50% of copy bandwidth at T=256, >= 1.3x at T <= 16.
            gates=[Gate("bandwidth_fraction_min", 0.5)]
            if T == 256
            else [Gate("speedup_min", 1.3)]
            if T <= 16
            else [],
        )
    )


def prefill_torch(q, kv, idx, scale, sink):
    """PyTorch path: gather rows, bmm logits, softmax with the sink column, bmm."""
    valid = (idx >= 0) & (idx < kv.shape[0])
    rows = kv[torch.where(valid, idx, 0).long()]  # [T, W, 512]
    s = torch.bmm(q, rows.transpose(1, 2)).float() * scale  # [T, H, W]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    s = torch.cat([s, sink[None, :, None].expand(q.shape[0], -1, 1)], dim=2)
    p = torch.softmax(s, dim=2)[..., :-1].to(torch.bfloat16)
    return torch.bmm(p, rows)


def _prefill_case(registry: Registry, T: int, heads: int, context: int):
    W = 640

    def setup():
        g = torch.Generator(device="cuda").manual_seed(context + heads)
        kv = (torch.randn(context + 128, 512, device="cuda", generator=g) * 1.4).bfloat16()
        idx = torch.randint(0, context + 128, (T, W), device="cuda", generator=g).int()
        q = (torch.randn(T, heads, 512, device="cuda", generator=g) * 1.4).bfloat16()
        sink = torch.randn(heads, device="cuda", generator=g) + 4
        # vLLM passes per-token lengths (from combine_topk_swa_indices): every entry here.
        lens = torch.full((T,), W, dtype=torch.int32, device="cuda")
        return q, kv, idx, sink, torch.empty_like(q), lens

    def candidate(st):
        q, kv, idx, sink, out, lens = st
        sparse_mla_prefill(q, kv, idx, SCALE, sink, topk_length=lens, out=out)
        return out

    registry.add(
        Case(
            suite=SUITE,
            name=f"mla_prefill_T{T}_H{heads}_ctx{context // 1024}K",
            params={"T": T, "heads": heads, "context": context, "width": W},
            setup=setup,
            baseline_name="torch gather + bmm + softmax(sink) + bmm",
            baseline=lambda st: prefill_torch(st[0], st[1], st[2], SCALE, st[3]),
            candidate_name=(
                "deepinfer prefill, "
                + prefill_engine(torch.device("cuda"))
                + " kernel (DEEPINFER_SPARSE_MLA_PREFILL picks)"
            ),
            candidate=candidate,
            check=lambda st, b, c: close_check(b, c, rel_tol=1e-2),
            flops=lambda st: T * heads * W * 512 * 4,
        )
    )


def build_registry() -> Registry:
    registry = Registry()
    for heads in (64, 32, 8):  # TP 1, 2, 8
        for T in (1, 4, 16, 64, 256):
            _decode_case(registry, T, heads, 128, 512)
    for heads in (64, 32, 8):  # decode_splits: throughput, one split per token
        for T in (1, 4, 16, 64, 256):
            _decode_case(registry, T, heads, 128, 512, splits="throughput")
    for T in (5, 80):  # DSpark draft layers: widened SWA window, no compressed cache
        _decode_case(registry, T, 32, 192, 0)
    for context in (16384, 65536):
        _prefill_case(registry, 1024, 64, context)
        _prefill_case(registry, 1024, 16, context)
    _gather_case(registry, "gather_16K", [16384], 64)
    _gather_case(registry, "gather_48K", [49152], 64)
    _gather_case(registry, "gather_4x16K_chunk", [16384, 16000, 12000, 16384], 64)
    _gather_case(registry, "gather_1M_ratio2_compressed", [524288], 32)
    for T in (1, 128, 4096):
        _insert_case(registry, T, 64)
    return registry


if __name__ == "__main__":
    sys.exit(main_for_suite(SUITE, build_registry()))
