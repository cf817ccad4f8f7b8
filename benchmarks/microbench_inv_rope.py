"""DeepSeek-V4.1's output projection on sm80: inverse RoPE + grouped wo_a (suite ``o_proj``).

On sm80 vLLM 0.33.0 runs ``dsv41_o_proj`` -> ``deep_gemm_fp8_o_proj`` with a bf16 wo_a
(dequantized at load by ``EmulationMxfp8LinearKernel``): ``fused_inv_rope_fp8_quant``
with ``quantize=False``, then ``torch.bmm`` over the groups, then wo_b (Marlin MXFP8,
unchanged by us and not measured here). vLLM's inverse-RoPE kernel does not compile
below sm_89, so the baseline is that step as vLLM's PyTorch RoPE computes it
(``forward_native(inverse=True)``: cos/sin gathered and repeated, ``x * cos +
rotate_gptj(x) * sin``, written into the same group-major buffer), followed by the
same ``torch.bmm`` vLLM issues. The candidate is ``deepinfer_sm80.ops.inv_rope`` plus
that ``torch.bmm``.

Checks before timing: the candidate's rotated rows bit-exact against ``ops/inv_rope``'s
reference with the GPU's FMA rounding (``contract=True``); the baseline's (PyTorch rounds
products and sums separately) and ``z`` within 1e-3 relative error of the candidate's.

Shapes: V4.1's 64 heads x 512 (448 + 64), 8 groups of 8 heads, o_lora_rank 1024; TP1 and
TP2 (32 heads read from the 64-head padded attention buffer, as
``attn_out[:, :n_local_heads]``). Gate for the RoPE alone: within 3x of the device floor
(empty-kernel launch + bytes at copy bandwidth).

Run: ``PYTHONPATH=overlay:. python -m benchmarks.microbench_inv_rope``
"""

import sys

import torch

from benchmarks.runner import (
    Case,
    CheckResult,
    Gate,
    Registry,
    close_check,
    exact_check,
    main_for_suite,
)
from deepinfer_sm80.ops.inv_rope import fused_inv_rope_fp8_quant
from deepinfer_sm80.ops.inv_rope.ref import inv_rope_fp8_quant_ref

SUITE = "o_proj"
HEADS, HEAD_DIM, NOPE, ROPE = 64, 512, 448, 64
GROUPS, O_LORA = 8, 1024
HEADS_PER_GROUP = HEADS // GROUPS
MAX_POS = 65536


def rotate_gptj(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...), as vLLM's ``rotate_gptj``."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def torch_inverse_rope(o, positions, cos_sin_cache, n_groups):
    """vLLM's PyTorch inverse RoPE, written into vLLM's ``[G, T, d]`` output buffer;
    returns the ``[T, G, d]`` view ``fused_inv_rope_fp8_quant`` returns."""
    num_tokens, num_heads, head_dim = o.shape
    rows = cos_sin_cache[positions]
    cos = rows[:, : ROPE // 2].repeat_interleave(2, dim=-1)[:, None]
    sin = -rows[:, ROPE // 2 :].repeat_interleave(2, dim=-1)[:, None]
    x = o[..., NOPE:]
    rotated = (x * cos + rotate_gptj(x) * sin).to(o.dtype)
    per_group = num_heads // n_groups
    out = torch.empty(n_groups, num_tokens, per_group * head_dim, dtype=o.dtype, device=o.device)
    heads = out.view(n_groups, num_tokens, per_group, head_dim).transpose(0, 1)
    heads[..., :NOPE] = o[..., :NOPE].view(num_tokens, n_groups, per_group, NOPE)
    heads[..., NOPE:] = rotated.view(num_tokens, n_groups, per_group, ROPE)
    return out.transpose(0, 1)


def grouped_wo_a(o_proj_input, weight, n_groups):
    """The bf16 branch of vLLM's ``deep_gemm_fp8_o_proj``: one bmm over the groups."""
    z = torch.empty(
        o_proj_input.shape[0], n_groups, O_LORA, dtype=torch.bfloat16, device=o_proj_input.device
    )
    grouped = weight.view(n_groups, O_LORA, -1)
    torch.bmm(o_proj_input.transpose(0, 1), grouped.transpose(1, 2), out=z.transpose(0, 1))
    return z


def _setup(num_tokens: int, tp: int, device: str):
    heads, groups = HEADS // tp, GROUPS // tp
    g = torch.Generator(device=device).manual_seed(num_tokens * 10 + tp)
    # The attention writes a 64-head padded buffer; o_proj reads its first n_local_heads.
    attn_out = torch.randn(num_tokens, HEADS, HEAD_DIM, device=device, generator=g)
    attn_out = attn_out.to(torch.bfloat16)
    positions = torch.randint(0, MAX_POS, (num_tokens,), device=device, generator=g)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, ROPE, 2, device=device) / ROPE)
    freqs = torch.arange(MAX_POS, device=device, dtype=torch.float32)[:, None] * inv_freq
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    weight = torch.randn(groups * O_LORA, HEADS_PER_GROUP * HEAD_DIM, device=device, generator=g)
    weight = (weight * 0.02).to(torch.bfloat16)
    return {
        "o": attn_out[:, :heads],
        "positions": positions,
        "cache": cache,
        "weight": weight,
        "groups": groups,
    }


def _ours(s):
    out, _ = fused_inv_rope_fp8_quant(
        s["o"], s["positions"], s["cache"], s["groups"], HEADS_PER_GROUP, NOPE, ROPE,
        quantize=False,
    )  # fmt: skip
    return out


def _theirs(s):
    return torch_inverse_rope(s["o"], s["positions"], s["cache"], s["groups"])


def _ours_then_wo_a(s):
    rotated = _ours(s)
    return rotated, grouped_wo_a(rotated, s["weight"], s["groups"])


def _theirs_then_wo_a(s):
    rotated = _theirs(s)
    return rotated, grouped_wo_a(rotated, s["weight"], s["groups"])


def _check_rotated(s, base, cand) -> CheckResult:
    o = s["o"]
    want, _ = inv_rope_fp8_quant_ref(
        o, s["positions"], s["cache"], s["groups"], HEADS_PER_GROUP, quantize=False,
        contract=o.device.type == "cuda",
    )  # fmt: skip
    exact = exact_check(want, cand)
    if not exact.ok:
        return CheckResult(False, f"candidate vs reference: {exact.detail}")
    # PyTorch rounds each product (no FMA): a few values differ, by a bf16 ulp or, after
    # cancellation, by the product's rounding error.
    differ = int((base.view(torch.int16) != cand.view(torch.int16)).sum())
    close = close_check(base, cand, 1e-3)
    return CheckResult(close.ok, f"bit-exact; baseline: {differ} values differ, {close.detail}")


def _check_full(s, base, cand) -> CheckResult:
    rotated = _check_rotated(s, base[0], cand[0])
    if not rotated.ok:
        return rotated
    z = close_check(base[1], cand[1], 1e-3)
    return CheckResult(z.ok, f"rotated {rotated.detail}; z {z.detail}")


def _add_cases(registry: Registry, num_tokens: int, tp: int, device: str) -> None:
    heads, groups = HEADS // tp, GROUPS // tp
    params = {"T": num_tokens, "tp": tp, "heads": heads, "groups": groups, "o_lora": O_LORA}
    rope_bytes = 2 * num_tokens * heads * HEAD_DIM * 2  # read o, write the rotated rows
    registry.add(
        Case(
            suite=SUITE,
            name=f"inv_rope_tp{tp}_T{num_tokens}",
            params=params,
            setup=lambda: _setup(num_tokens, tp, device),
            baseline_name="vLLM PyTorch inverse RoPE (forward_native)",
            baseline=_theirs,
            candidate_name="deepinfer inv_rope (quantize=False)",
            candidate=_ours,
            check=_check_rotated,
            bytes_moved=lambda s: rope_bytes,
            gates=[Gate("floor_ratio_max", 3.0)],
        )
    )
    registry.add(
        Case(
            suite=SUITE,
            name=f"o_proj_a_tp{tp}_T{num_tokens}",
            params=params,
            setup=lambda: _setup(num_tokens, tp, device),
            baseline_name="vLLM PyTorch inverse RoPE + vLLM's grouped torch.bmm",
            baseline=_theirs_then_wo_a,
            candidate_name="deepinfer inv_rope + vLLM's grouped torch.bmm",
            candidate=_ours_then_wo_a,
            check=_check_full,
            bytes_moved=lambda s: rope_bytes + groups * O_LORA * HEADS_PER_GROUP * HEAD_DIM * 2,
            flops=lambda s: 2 * num_tokens * groups * HEADS_PER_GROUP * HEAD_DIM * O_LORA,
        )
    )


def build_registry(device: str = "cuda") -> Registry:
    """Cases are built lazily: nothing touches ``device`` until a case's setup runs."""
    registry = Registry()
    # Decode (a few requests x DSpark's 6 verified tokens) to prefill chunks (16K tokens).
    for num_tokens in (1, 8, 64, 256, 1024, 4096, 16384):
        _add_cases(registry, num_tokens, 1, device)
    for num_tokens in (1, 256, 4096):
        _add_cases(registry, num_tokens, 2, device)
    return registry


if __name__ == "__main__":
    sys.exit(main_for_suite(SUITE, build_registry()))
