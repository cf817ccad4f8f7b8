"""The mHC TileLang kernels under compute-sanitizer's racecheck (shared-memory hazards).

TileLang warns, when it builds the Tensor Core kernel, that ``w_s`` is "written by multiple
threads". The fill's coordinates are enumerated at build time (``check_tile_fill`` in
``ops/mhc/tilelang_kernels.py``: every element written exactly once); this runs every mHC
kernel once at the real geometry (hidden 5120, 4 streams) on a GPU, under racecheck, so
that the hardware's view of the same question is on record too:

    compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 1 \\
        python -m benchmarks.mhc_racecheck

Token counts: 1, 3 (the CUDA-core kernel's token groups), 16 and 67 (the Tensor Core kernel:
one full tile and a ragged last tile). The outputs are checked against the fp32
reference as well, so a run whose kernels did not run cannot pass.
"""

from __future__ import annotations

import sys

import torch

from deepinfer_sm80.ops.mhc import ops, ref
from deepinfer_sm80.ops.mhc.inputs import model_like_inputs

TOKENS = (1, 3, 16, 67)


def check_once(num_tokens: int) -> list[str]:
    inp = model_like_inputs(num_tokens, device="cuda", seed=num_tokens)
    args = inp.positional()
    got = ops.mhc_fused_post_pre_delayed(*args, pre_mix=inp.pre_mix, norm_weight=inp.norm_weight)
    want = ref.fused_post_pre_delayed_ref(
        *(a.cpu() if isinstance(a, torch.Tensor) else a for a in args),
        pre_mix=inp.pre_mix.cpu(),
        norm_weight=inp.norm_weight.cpu(),
    )
    post = ops.mhc_post(inp.x, inp.residual, inp.post_layer_mix, inp.comb_res_mix)
    post_want, _ = ref.post_fixed_order(
        inp.x.cpu(), inp.residual.cpu(), inp.post_layer_mix.cpu(), inp.comb_res_mix.cpu()
    )
    torch.cuda.synchronize()
    problems = []
    # residual_cur, layer input: bf16 outputs within a few bf16 ulps of the fp32 reference.
    for name, g, w in (("residual_cur", got[0], want[0]), ("layer_input", got[3], want[3])):
        err = (g.float().cpu() - w.float()).abs().max().item()
        scale = w.float().abs().max().item()
        if not err <= 2**-6 * scale:
            problems.append(f"T={num_tokens} {name}: max |got - ref| {err:.4g} (scale {scale:.4g})")
    if not torch.equal(post.cpu(), post_want):
        problems.append(f"T={num_tokens} mhc_post: differs from post_fixed_order")
    return problems


def main() -> int:
    if not torch.cuda.is_available():
        print("mhc_racecheck: needs a CUDA GPU", file=sys.stderr)
        return 2
    problems = []
    for t in TOKENS:
        problems += check_once(t)
        print(f"T={t}: ran", flush=True)
    for p in problems:
        print("MISMATCH", p)
    print(
        f"{torch.cuda.get_device_name(0)}: {len(TOKENS)} token counts, {len(problems)} mismatches"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
