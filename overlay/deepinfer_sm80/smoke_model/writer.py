"""Materialize the plan into safetensors shards, one shard in memory at a time.

Values are a pure function of (seed, tensor name, device kind): each tensor draws
from its own generator seeded by a hash of the two, so a tensor does not depend
on the order or presence of the others. CUDA and CPU generators differ, so the
same seed gives different (each deterministic) checkpoints on the two devices.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from . import geometry as geo
from . import plan as plan_mod
from . import quant, tokenizer

# the attention projections the negative control perturbs
PERTURBED_PROJECTIONS = ("attn.wq_b", "attn.wo_b")
# calibration stops once the realized change is this close (relative) to the target
_CALIBRATION_TOLERANCE = 0.02


@dataclass
class Perturbation:
    layer: int
    rel: float
    realized: dict[str, float] = field(default_factory=dict)


def _seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(_seed(seed, name))
    return gen


def float_values(p: plan_mod.Param, seed: int, device: torch.device) -> torch.Tensor:
    """The unquantized fp32 values of one tensor."""
    kind = p.init[0]
    if kind == "normal":
        gen = _generator(seed, p.name, device)
        return torch.randn(p.shape, generator=gen, device=device) * p.init[1]
    if kind == "const":
        return torch.full(p.shape, float(p.init[1]), device=device)
    if kind == "hc_scale":
        return torch.full(p.shape, float(p.init[1]), device=device)
    if kind == "route":
        _, first, count, bias = p.init
        out = torch.zeros(p.shape, device=device)
        out[[(first + k) % p.shape[0] for k in range(count)]] = float(bias)
        return out
    if kind == "hc_base":
        # pre/post mixes start at sigmoid(0); the stream-mixing logits favour
        # the diagonal so Sinkhorn yields a near-identity, non-degenerate mix.
        hc = p.init[1]
        base = torch.zeros(p.shape, device=device)
        base[2 * hc :].view(hc, hc).fill_diagonal_(1.0)
        return base
    raise ValueError(f"{p.name}: unknown init {p.init!r}")


def quantize(p: plan_mod.Param, w: torch.Tensor) -> list[torch.Tensor]:
    if p.fmt == "mxfp8":
        return list(quant.quantize_fp8(w, quant.BLOCK))
    if p.fmt == "mxfp8_rows":
        return list(quant.quantize_fp8(w, 1))
    if p.fmt == "mxfp4":
        return list(quant.quantize_fp4(w))
    return [w.to(torch.bfloat16 if p.fmt == "bf16" else torch.float32)]


def dequantize(p: plan_mod.Param, stored: list[torch.Tensor]) -> torch.Tensor:
    if p.fmt == "mxfp8":
        return quant.dequantize_fp8(*stored, quant.BLOCK)
    if p.fmt == "mxfp8_rows":
        return quant.dequantize_fp8(*stored, 1)
    if p.fmt == "mxfp4":
        return quant.dequantize_fp4(*stored)
    return stored[0].float()


def _relative_change(new: torch.Tensor, old: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(new - old) / torch.linalg.vector_norm(old))


def perturb(
    p: plan_mod.Param, stored: list[torch.Tensor], rel: float, seed: int
) -> tuple[list[torch.Tensor], float]:
    """Requantize ``stored`` after adding Gaussian noise to its dequantized values,
    with the noise level chosen so the *quantized* tensor moves by ``rel``
    (Frobenius norm, relative).

    Rounding to the e4m3 grid absorbs most small per-element changes and turns
    the rest into whole grid steps, so the noise level that realizes ``rel`` is
    found by bisection on the requantized result.
    """
    base = dequantize(p, stored)
    rms = torch.linalg.vector_norm(base) / math.sqrt(base.numel())
    noise = torch.randn(
        base.shape, generator=_generator(seed, p.name + ":perturb", base.device), device=base.device
    )

    def attempt(sigma: float):
        requant = quantize(p, base + sigma * rms * noise)
        return requant, _relative_change(dequantize(p, requant), base)

    lo, hi = 0.0, rel
    requant, realized = attempt(hi)
    while realized < rel and hi < 1.0:
        lo, hi = hi, hi * 2
        requant, realized = attempt(hi)
    best = (abs(realized - rel), requant, realized)
    for _ in range(40):
        if best[0] <= _CALIBRATION_TOLERANCE * rel:
            break
        mid = (lo + hi) / 2
        requant, realized = attempt(mid)
        if abs(realized - rel) < best[0]:
            best = (abs(realized - rel), requant, realized)
        if realized < rel:
            lo = mid
        else:
            hi = mid
    return best[1], best[2]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible; use --device cpu")
    return torch.device(name)


def write(
    directory: Path,
    geometry: geo.Geometry,
    *,
    seed: int = 0,
    perturbation: Perturbation | None = None,
    device: torch.device | None = None,
    shard_bytes: int = 2 << 30,
    log=print,
) -> dict:
    """Write the whole checkpoint into ``directory`` (which must exist)."""
    device = device or torch.device("cpu")
    started = time.monotonic()
    vocab = tokenizer.write(directory)
    config = geo.hf_config(geometry, vocab)
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    generation = {"bos_token_id": vocab["bos_token_id"], "eos_token_id": vocab["eos_token_id"]}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=1) + "\n")

    params = plan_mod.params(geometry, vocab["vocab_size"])
    groups = plan_mod.shards(params, shard_bytes)
    perturbed = set()
    if perturbation is not None:
        perturbed = {f"layers.{perturbation.layer}.{n}" for n in PERTURBED_PROJECTIONS}
    weight_map: dict[str, str] = {}
    total = 0
    for index, group in enumerate(groups, 1):
        filename = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for p in group:
            stored = quantize(p, float_values(p, seed, device))
            if p.name in perturbed:
                stored, realized = perturb(p, stored, perturbation.rel, seed)
                perturbation.realized[p.name] = realized
                log(f"perturbed {p.name}: relative change {realized:.4%}")
            for (name, shape, _), tensor in zip(p.stored(), stored, strict=True):
                assert tuple(tensor.shape) == shape, (name, tensor.shape, shape)
                tensors[name] = tensor.cpu()
                weight_map[name] = filename
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        save_file(tensors, str(directory / filename), metadata={"format": "pt"})
        (directory / filename).chmod(0o644)  # the serving container may run as another user
        total += size
        log(f"wrote {filename}: {len(tensors)} tensors, {size / 1e9:.2f} GB")
        del tensors
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=1) + "\n")
    summary = {
        "preset": geometry.preset,
        "seed": seed,
        "device_kind": device.type,
        "index_n_heads": geometry.index_n_heads,
        "tensors": len(weight_map),
        "shards": len(groups),
        "total_bytes": total,
        "perturbation": None
        if perturbation is None
        else {
            "layer": perturbation.layer,
            "rel": perturbation.rel,
            "realized": perturbation.realized,
        },
        "seconds": round(time.monotonic() - started, 1),
    }
    (directory / "smoke_model.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
