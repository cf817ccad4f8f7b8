"""Model-like inputs for the mHC boundary (tests and benchmarks share them).

Not all-small: residual rows span four decades of RMS across tokens (some rows near 1e-2,
others near 1e2), streams differ in scale, 1% of elements are 20x spikes, the sublayer
output has its own per-token scale, and the coefficients come from the model's own
maps (post = 2 * sigmoid, comb = a Sinkhorn-normalized 4x4, pre = sigmoid + eps). The
weights are scaled so the normalized mixes have a standard deviation near 2, as trained
hyper-connection projections do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_sm80.ops.mhc.geometry import HC_MULT, HIDDEN, SINKHORN_ITERS, mix_size
from deepinfer_sm80.ops.mhc.ref import sinkhorn_ref

# DeepSeek-V4.1-Flash: rms_norm_eps 1e-20 (mixes' RMS and the attn/ffn RMSNorm),
# hc_eps 1e-6 (pre and Sinkhorn eps), post multiplier 2.0, 20 Sinkhorn iterations.
MODEL_SCALARS = {
    "rms_eps": 1e-20,
    "hc_pre_eps": 1e-6,
    "hc_sinkhorn_eps": 1e-6,
    "hc_post_mult_value": 2.0,
    "sinkhorn_repeat": SINKHORN_ITERS,
}
NORM_EPS = 1e-20


@dataclass
class MhcInputs:
    x: torch.Tensor
    residual: torch.Tensor
    post_layer_mix: torch.Tensor
    comb_res_mix: torch.Tensor
    fn: torch.Tensor
    hc_scale: torch.Tensor
    hc_base: torch.Tensor
    pre_mix: torch.Tensor
    norm_weight: torch.Tensor

    def positional(self) -> tuple:
        """The first twelve positional arguments of ``mhc_fused_post_pre_delayed``."""
        s = MODEL_SCALARS
        return (
            self.x,
            self.residual,
            self.post_layer_mix,
            self.comb_res_mix,
            self.fn,
            self.hc_scale,
            self.hc_base,
            s["rms_eps"],
            s["hc_pre_eps"],
            s["hc_sinkhorn_eps"],
            s["hc_post_mult_value"],
            s["sinkhorn_repeat"],
        )


def model_like_inputs(
    num_tokens: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
    hidden: int = HIDDEN,
    hc: int = HC_MULT,
) -> MhcInputs:
    g = torch.Generator().manual_seed(seed)
    n = num_tokens
    token_scale = torch.logspace(-2, 2, max(n, 1))[torch.randperm(max(n, 1), generator=g)][:n]
    stream_scale = torch.tensor([1.0, 0.5, 2.0, 0.25])[:hc]
    residual = torch.randn(n, hc, hidden, generator=g) * token_scale[:, None, None]
    residual = residual * stream_scale[None, :, None]
    spikes = torch.rand(n, hc, hidden, generator=g) < 0.01
    residual = torch.where(spikes, residual * 20, residual)
    x = torch.randn(n, hidden, generator=g) * token_scale.flip(0)[:, None]
    mix = mix_size(hc)
    fn = torch.randn(mix, hc * hidden, generator=g) * (2.0 / (hc * hidden) ** 0.5)
    hc_scale = torch.tensor([0.8, 0.6, 1.2])
    hc_base = torch.randn(mix, generator=g) * 0.5
    post = 2.0 * torch.sigmoid(torch.randn(n, hc, 1, generator=g))
    comb = sinkhorn_ref(torch.randn(n, hc, hc, generator=g) * 2.0, 1e-6, SINKHORN_ITERS)
    pre = torch.sigmoid(torch.randn(n, hc, generator=g)) + 1e-6
    norm_weight = 1.0 + 0.1 * torch.randn(hidden, generator=g)

    def dev(t, dtype):
        return t.to(dtype).contiguous().to(device)

    return MhcInputs(
        x=dev(x, torch.bfloat16),
        residual=dev(residual, torch.bfloat16),
        post_layer_mix=dev(post, torch.float32),
        comb_res_mix=dev(comb, torch.float32),
        fn=dev(fn, torch.float32),
        hc_scale=dev(hc_scale, torch.float32),
        hc_base=dev(hc_base, torch.float32),
        pre_mix=dev(pre, torch.float32),
        norm_weight=dev(norm_weight, torch.bfloat16),
    )
