"""Plain PyTorch references for the mHC boundary (no vLLM import: GPU tests use these).

``fused_post_pre_delayed_ref`` is the delayed formulation in fp32, written to be read:

    residual_cur[j] = post[j] * x + sum_i comb[i, j] * residual[i]      -> bf16 (materialized)
    mixes  = (residual_cur . fn^T) * rsqrt(mean(residual_cur^2) + rms_eps)
    pre    = sigmoid(mixes[:hc] * s0 + base[:hc]) + pre_eps              (the *next* pre)
    post'  = sigmoid(mixes[hc:2hc] * s1 + base[hc:2hc]) * post_mult
    comb'  = Sinkhorn(softmax(mixes[2hc:] (hc x hc) * s2 + base) + eps), repeat iterations
    y      = sum_i pre_mix[i] * residual_cur[i] (stream 0 without pre_mix)  -> bf16
    layer_input = bf16(y * rsqrt(mean(y^2) + norm_eps) * norm_weight)     (or y, no weight)

The two bf16 roundings are part of the op's contract (vLLM materializes ``residual_cur``
in bf16 and keeps a bf16 boundary before the input RMSNorm); everything else is fp32.
``fused_post_pre_delayed_ref(..., dtype=torch.bfloat16)`` is "PyTorch in bf16": the same
maths on bf16 tensors, the yardstick of the bf16 error budget (tools/compare.py).

``post_fixed_order`` is the bit-exact reference of ``mhc_post_with_sqrsum``: it performs
the kernel's fp32 operations in the kernel's order, one PyTorch op per rounding (a
product, then a sum, never fused), so its bf16 output equals the kernel's bit for bit.
"""

from __future__ import annotations

import torch


def sinkhorn_ref(logits: torch.Tensor, eps: float, repeat: int) -> torch.Tensor:
    """softmax over the last dim + eps, then alternate column / row normalization."""
    comb = torch.softmax(logits, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def post_ref(x, residual, post_layer_mix, comb_res_mix, dtype=torch.float32):
    """post * x + comb^T . residual, in ``dtype`` (not rounded to bf16 here)."""
    n, hc, _ = residual.shape
    comb = comb_res_mix.to(dtype)
    mixed = torch.einsum("tij,tih->tjh", comb, residual.to(dtype))
    return mixed + post_layer_mix.reshape(n, hc, 1).to(dtype) * x.unsqueeze(1).to(dtype)


def fused_post_pre_delayed_ref(
    x,
    residual,
    post_layer_mix,
    comb_res_mix,
    fn,
    hc_scale,
    hc_base,
    rms_eps,
    hc_pre_eps,
    hc_sinkhorn_eps,
    hc_post_mult_value,
    sinkhorn_repeat,
    pre_mix=None,
    norm_weight=None,
    norm_eps=1e-6,
    capture_aux=False,
    dtype=torch.float32,
):
    """Outputs of ``mhc_fused_post_pre_delayed`` (same order), computed in ``dtype``."""
    n, hc, hidden = residual.shape
    residual_cur = post_ref(x, residual, post_layer_mix, comb_res_mix, dtype).to(torch.bfloat16)
    r = residual_cur.to(dtype)
    flat = r.reshape(n, hc * hidden)
    mixes = (flat @ fn.to(dtype).t()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + rms_eps)
    scale, base = hc_scale.to(dtype), hc_base.to(dtype)
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + hc_pre_eps
    post = torch.sigmoid(mixes[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc]) * hc_post_mult_value
    logits = mixes[:, 2 * hc :].reshape(n, hc, hc) * scale[2] + base[2 * hc :].reshape(1, hc, hc)
    comb = sinkhorn_ref(logits, hc_sinkhorn_eps, sinkhorn_repeat)
    if pre_mix is None:
        y = r[:, 0]
    else:
        y = (pre_mix.to(dtype).unsqueeze(-1) * r).sum(dim=1)
    y = y.to(torch.bfloat16)
    if norm_weight is None:
        layer_input = y
    else:
        yf = y.to(dtype)
        layer_input = (
            yf * torch.rsqrt(yf.square().mean(-1, keepdim=True) + norm_eps) * norm_weight.to(dtype)
        ).to(torch.bfloat16)
    if capture_aux:
        aux = r.mean(dim=1).to(torch.bfloat16)
    else:
        aux = torch.empty(0, hidden, dtype=torch.bfloat16, device=residual.device)
    return (
        residual_cur,
        post.float().unsqueeze(-1),
        comb.float(),
        layer_input,
        pre.float(),
        aux,
    )


def post_fixed_order(x, residual, post_layer_mix, comb_res_mix):
    """Bit-exact reference of ``mhc_post_with_sqrsum``: (residual_out bf16, sqrsum fp32).

    out[t, j] = ((((post[t, j] * x) + comb[t, 0, j] * r0) + comb[t, 1, j] * r1)
                 + comb[t, 2, j] * r2) + comb[t, 3, j] * r3, each op a separate fp32
    rounding (torch.mul and torch.add on fp32 tensors never fuse), then bf16.
    """
    n, hc, _ = residual.shape
    xf = x.float()
    rf = residual.float()
    post = post_layer_mix.reshape(n, hc).float()
    comb = comb_res_mix.float()
    out = torch.empty_like(residual)
    for j in range(hc):
        acc = torch.mul(post[:, j : j + 1], xf)
        for i in range(hc):
            acc = torch.add(acc, torch.mul(comb[:, i, j : j + 1], rf[:, i]))
        out[:, j] = acc.to(torch.bfloat16)
    sqrsum = out.float().square().sum(dim=(1, 2))
    return out, sqrsum
