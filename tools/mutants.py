"""Standard mutants: small, plausible kernel bugs, made by changing a real kernel's
inputs or outputs, that every numeric test of attention, mHC and the indexer must reject.

A test earns its keep only if it can fail. Each function below returns a changed copy
(never the argument itself) of what a kernel reads or writes:

==================  ============================================  =========================
mutant              the bug it stands for                          how it is made
==================  ============================================  =========================
scale               a constant off by 2**-6 (a softmax scale,      output x (1 + 2**-6)
                    a normalizer)
drop-tile           one 16-row tile of the KV loop skipped         its 16 index entries -1
ignore-sink         the attention sink left out of the softmax     the sink passed as None
ue8m0-exponent      a scale byte misread by one                    one UE8M0 byte + 1 in the
                                                                   cache (one fp32 scale x 2
                                                                   for the indexer's keys)
neighbour-row       an off-by-one address                          one index entry + 1 (one
                                                                   key row read from the next)
swap-heads          two heads' outputs exchanged                   output heads 0 and 1 swapped
                                                                   (query heads for the
                                                                   indexer, whose output sums
                                                                   over heads)
==================  ============================================  =========================

The tests (``tests/ops/test_sparse_mla.py``, ``test_mhc.py``, ``test_indexer_logits.py``)
say which mutants apply to which kernel and run each through the same check the real
case passes.
"""

import torch

from tools.poison import cache_bytes

SCALE_FACTOR = 1 + 2.0**-6
TILE_ROWS = 16

MUTANTS = ("scale", "drop-tile", "ignore-sink", "ue8m0-exponent", "neighbour-row", "swap-heads")


def scale(out: torch.Tensor) -> torch.Tensor:
    """``out`` times (1 + 2**-6), rounded back to its dtype."""
    return (out.double() * SCALE_FACTOR).to(out.dtype)


def drop_tile(indices: torch.Tensor, tile: int = 1) -> torch.Tensor:
    """Entries ``[16 tile, 16 tile + 16)`` of every token's index list set to -1 (skipped):
    the kernel never sees those rows."""
    if indices.shape[-1] < TILE_ROWS * (tile + 1):
        raise ValueError(f"tile={tile}: the index list has only {indices.shape[-1]} entries")
    out = indices.clone()
    out[..., TILE_ROWS * tile : TILE_ROWS * (tile + 1)] = -1
    return out


def ignore_sink(sink: torch.Tensor | None) -> None:
    """No sink: the softmax denominator loses exp(sink)."""
    if sink is None:
        raise ValueError("sink: the case has no attention sink, so ignoring it changes nothing")
    return None


def shift_ue8m0_exponent(
    k_cache: torch.Tensor, slot: int, group: int = 0, by: int = 1
) -> torch.Tensor:
    """A copy of a paged 584-byte V4 cache with the UE8M0 scale byte of ``group`` (one of
    the 7 NoPE groups of 64 dims) at global ``slot`` moved by ``by``: that group of that
    row is read 2**by times too large."""
    from deepinfer_sm80.ops.kv_cache.layout import NUM_SCALES
    from deepinfer_sm80.ops.kv_cache.ref import page_views

    if not 0 <= group < NUM_SCALES:
        raise ValueError(f"group={group}: expected 0..{NUM_SCALES - 1}")
    block_size = k_cache.shape[1]
    copy = cache_bytes(k_cache).clone().as_strided(k_cache.shape, k_cache.stride())
    _, scales = page_views(copy, block_size)
    byte = scales[slot // block_size, slot % block_size, group]
    if not 0 <= int(byte) + by <= 254:
        raise ValueError(f"slot={slot}: scale byte {int(byte)} cannot move by {by}")
    scales[slot // block_size, slot % block_size, group] = byte + by
    return copy


def shift_scale_exponent(scales: torch.Tensor, index: int, by: int = 1) -> torch.Tensor:
    """A copy of per-row fp32 scales with row ``index``'s exponent moved by ``by``."""
    out = scales.clone()
    out[index] = out[index] * 2.0**by
    return out


def read_neighbour(indices: torch.Tensor, token: int, entry: int, by: int = 1) -> torch.Tensor:
    """A copy of the index lists with one entry pointing ``by`` rows further on."""
    out = indices.clone()
    if int(out[token, entry]) < 0:
        raise ValueError(f"indices[{token}, {entry}] is a hole (-1): no row to move from")
    out[token, entry] += by
    return out


def read_neighbour_key(keys: torch.Tensor, scales: torch.Tensor, row: int):
    """Copies of (keys, scales) in which key ``row`` is read from ``row + 1``."""
    keys, scales = keys.clone(), scales.clone()
    keys[row], scales[row] = keys[row + 1], scales[row + 1]
    return keys, scales


def swap_heads(x: torch.Tensor, a: int = 0, b: int = 1, dim: int = 1) -> torch.Tensor:
    """A copy of ``x`` with heads ``a`` and ``b`` (along ``dim``) exchanged."""
    out = x.clone()
    ia, ib = [slice(None)] * dim + [a], [slice(None)] * dim + [b]
    out[tuple(ia)], out[tuple(ib)] = x[tuple(ib)], x[tuple(ia)]
    return out


def zero_column_tile(logits: torch.Tensor, tile: int = 1) -> torch.Tensor:
    """Scores of keys ``[16 tile, 16 tile + 16)`` left at the accumulator's 0: the tile of
    keys skipped (for kernels whose output has one column per key). Masked (-inf)
    columns stay masked."""
    out = logits.clone()
    cols = out[:, TILE_ROWS * tile : TILE_ROWS * (tile + 1)]
    cols[torch.isfinite(cols)] = 0
    return out
