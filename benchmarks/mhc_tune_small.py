"""Sweep the small mHC kernel's launch shape per token count, timing the whole op.

Below 16 tokens ``mhc_fused_post_pre_delayed`` runs the CUDA-core kernel with a
(token_group, tile_n) shape from ``geometry.small_config``. This times the whole op (both
launches, ``runner.CudaTimer``: cold L2, host overhead hidden) for other shapes, next to
the rebuilt vLLM Ampere strategy in the same process. Every shape must give the shipped
shape's bits exactly (a token's arithmetic does not depend on its group or tile), or its
time is not reported.

Run on a GPU: ``PYTHONPATH=overlay:. python3 -m benchmarks.mhc_tune_small [--tokens 6,12]``.
Ampere fitness of a shape (registers, spills, shared memory) is checked separately by
``tilelang_build.fit_report`` once it is shipped (``make test`` does that for every
shipped variant).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

GROUPS = (1, 2, 3, 4, 6, 8)
TILES = (1, 2, 3, 4, 6)
THREADS = 160  # 640-wide slice / 4 elements per thread


def shapes_for(num_tokens: int, groups=GROUPS, tiles=TILES):
    """(token_group, tile_n) pairs the small kernel accepts for ``num_tokens``."""
    for group, tile in itertools.product(groups, tiles):
        # A group at least twice the token count only adds spare (never stored) tokens.
        if group >= 2 * num_tokens or group * (tile + 2) > THREADS:
            continue
        yield group, tile


def _label(group: int, tile: int, hoist: bool) -> str:
    return f"g{group} n{tile} {'hoisted' if hoist else 'behind barrier'}"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.microbench_mhc import _inputs, _ours, _rebuilt
    from benchmarks.runner import CudaTimer, device_info
    from deepinfer_sm80.ops.mhc import geometry, ops

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="6,12,15")
    parser.add_argument("--groups", default=",".join(map(str, GROUPS)))
    parser.add_argument("--tiles", default=",".join(map(str, TILES)))
    parser.add_argument("--hoist", default="0,1", help="hoist_loads values to try")
    args = parser.parse_args(argv)
    groups = [int(g) for g in args.groups.split(",")]
    tiles = [int(t) for t in args.tiles.split(",")]
    hoists = [bool(int(h)) for h in args.hoist.split(",")]
    info = device_info()
    print(
        f"[mhc_tune_small] {info.get('gpu')} | torch {info['torch']} | tilelang "
        f"{info.get('tilelang')} | CUDA {info['cuda_runtime']}",
        flush=True,
    )
    timer = CudaTimer()
    shipped_config = ops.small_config
    for num_tokens in (int(t) for t in args.tokens.split(",")):
        inp = _inputs(num_tokens)
        want = [t.clone() for t in _ours(inp)]
        base_us = timer(lambda inp=inp: _rebuilt(inp)).median_us
        shipped = shipped_config(num_tokens)
        print(f"[mhc_tune_small] T={num_tokens} rebuilt vLLM: {base_us:.2f} us", flush=True)
        for (group, tile), hoist in itertools.product(
            shapes_for(num_tokens, groups, tiles), hoists
        ):
            name = f"T={num_tokens} {_label(group, tile, hoist)}"
            shape = geometry.SmallConfig(group, tile, hoist)
            ops.small_config = lambda n, c=shape: c
            ops.fused_variant.cache_clear()
            try:
                got = _ours(inp)
                same = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
                us = timer(lambda inp=inp: _ours(inp)).median_us if same else None
            except Exception as exc:  # noqa: BLE001 -- a shape that does not build is data
                print(f"[mhc_tune_small] {name}: {exc!r}"[:300])
                continue
            finally:
                ops.small_config = shipped_config
                ops.fused_variant.cache_clear()
            mark = " (shipped)" if shape == shipped else ""
            if us is None:
                print(f"[mhc_tune_small] {name}: BITS DIFFER{mark}")
                continue
            print(
                f"[mhc_tune_small] {name}: {us:.2f} us ({base_us / us:.2f}x vs rebuilt){mark}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
