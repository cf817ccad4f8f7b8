"""``python -m deepinfer_sm80.smoke_model DIR``: write the smoke checkpoint."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import geometry as geo


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write a small random DeepSeek-V4.1 checkpoint that vLLM 0.33.0 "
        "serves with --load-format safetensors (see smoke_model/README.md).",
    )
    p.add_argument("directory", help="output folder (created; must be empty unless --force)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", choices=sorted(geo.PRESETS), default="full")
    p.add_argument(
        "--perturb-layer",
        type=int,
        help="negative control: change this backbone layer's attention wq_b/wo_b",
    )
    p.add_argument(
        "--perturb-rel",
        type=float,
        help="relative change of the perturbed tensors after quantization (default 0.01)",
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--index-heads", type=int, choices=(32, 64), help="indexer heads (default 64)")
    p.add_argument("--shard-gb", type=float, default=2.0, help="target shard size in GB")
    p.add_argument("--force", action="store_true", help="write into a non-empty folder")
    return p


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None, prog: str = "python -m deepinfer_sm80.smoke_model") -> int:
    args = _parser(prog).parse_args(argv)
    geometry = geo.PRESETS[args.preset]
    if args.index_heads is not None:
        geometry = geo.with_index_heads(geometry, args.index_heads)
    if args.perturb_rel is not None and args.perturb_layer is None:
        return _fail("--perturb-rel needs --perturb-layer (which layer to perturb)")
    rel = None
    if args.perturb_layer is not None:
        if not 0 <= args.perturb_layer < geometry.num_hidden_layers:
            return _fail(
                f"--perturb-layer {args.perturb_layer} is outside the backbone layers "
                f"0..{geometry.num_hidden_layers - 1} of the {args.preset} preset"
            )
        rel = 0.01 if args.perturb_rel is None else args.perturb_rel
        if not 0.0 < rel <= 0.5:
            return _fail(f"--perturb-rel {rel} must be in (0, 0.5], e.g. 0.01 for 1%")
    if args.shard_gb <= 0:
        return _fail(f"--shard-gb {args.shard_gb} must be positive")
    directory = Path(args.directory)
    if directory.exists() and not directory.is_dir():
        return _fail(f"{directory} exists and is not a folder")
    if directory.is_dir() and any(directory.iterdir()) and not args.force:
        return _fail(f"{directory} is not empty; pick an empty folder or pass --force")
    try:
        from . import writer
    except ImportError as exc:
        return _fail(f"smoke-model needs torch, safetensors and tokenizers ({exc})")
    try:
        device = writer.resolve_device(args.device)
    except ValueError as exc:
        return _fail(str(exc))
    perturbation = None
    if rel is not None:
        perturbation = writer.Perturbation(layer=args.perturb_layer, rel=rel)
    directory.mkdir(parents=True, exist_ok=True)
    summary = writer.write(
        directory,
        geometry,
        seed=args.seed,
        perturbation=perturbation,
        device=device,
        shard_bytes=int(args.shard_gb * 1e9),
    )
    print(
        f"{directory}: {summary['tensors']} tensors in {summary['shards']} shards, "
        f"{summary['total_bytes']:,} bytes total ({args.preset} preset, seed {args.seed}, "
        f"{device.type}, {summary['seconds']} s)"
    )
    return 0
