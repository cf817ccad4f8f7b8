"""Public mHC entry points: argument checks, output allocation, kernel choice and launch.

``mhc_fused_post_pre_delayed`` has the signature, outputs and semantics of vLLM 0.33.0's
``mhc_fused_post_pre_delayed_tilelang``; ``mhc_post`` those of ``mhc_post_tilelang``.
``mhc_post_with_sqrsum`` is new (see its docstring).
"""

from __future__ import annotations

from functools import cache

import torch

from deepinfer_sm80.ops._validate import check_tensor
from deepinfer_sm80.ops.mhc.geometry import (
    N_SPLITS,
    check_supported_shape,
    choose_path,
    mix_size,
    small_config,
    tensor_core_config,
)
from deepinfer_sm80.ops.mhc.variants import KernelVariant
from deepinfer_sm80.tilelang_build import get_kernel


@cache
def fused_variant(num_tokens: int, hidden: int, hc: int) -> KernelVariant:
    """The post + prenorm kernel variant that serves ``num_tokens`` tokens."""
    if choose_path(num_tokens) == "small":
        cfg = small_config(num_tokens)
        return KernelVariant.make(
            "post_prenorm_small",
            hidden=hidden,
            hc=hc,
            token_group=cfg.token_group,
            tile_n=cfg.tile_n,
            hoist_loads=cfg.hoist_loads,
        )
    cfg = tensor_core_config(num_tokens)
    return KernelVariant.make(
        "post_prenorm_tc",
        hidden=hidden,
        hc=hc,
        block_m=cfg.block_m,
        block_h=cfg.block_h,
        num_stages=cfg.num_stages,
        threads=cfg.threads,
        sub_blocks=cfg.sub_blocks,
    )


def partial_rows(num_tokens: int) -> int:
    """Rows of the GEMM partial buffers the path for ``num_tokens`` writes."""
    if choose_path(num_tokens) == "small":
        return N_SPLITS
    return N_SPLITS * tensor_core_config(num_tokens).sub_blocks


@cache
def epilogue_variant(
    hidden: int,
    hc: int,
    n_part: int,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    norm_eps: float,
) -> KernelVariant:
    return KernelVariant.make(
        "mix_norm_epilogue",
        hidden=hidden,
        hc=hc,
        n_part=n_part,
        rms_numel=hc * hidden,
        rms_eps=float(rms_eps),
        hc_pre_eps=float(hc_pre_eps),
        hc_sinkhorn_eps=float(hc_sinkhorn_eps),
        hc_post_mult_value=float(hc_post_mult_value),
        sinkhorn_repeat=int(sinkhorn_repeat),
        norm_eps=float(norm_eps),
    )


@cache
def post_variant(hidden: int, hc: int) -> KernelVariant:
    return KernelVariant.make("post_sqrsum", hidden=hidden, hc=hc)


def _check_post_inputs(x, residual, post_layer_mix, comb_res_mix):
    check_tensor("residual", residual, dtype=torch.bfloat16, ndim=3)
    if not residual.is_contiguous():
        raise ValueError(
            "residual: must be contiguous (tokens, hc_mult, hidden_size); call .contiguous()"
        )
    n, hc, hidden = residual.shape
    dev = residual.device
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, device=dev)
    if tuple(x.shape) != (n, hidden) or not x.is_contiguous():
        raise ValueError(
            f"x: expected a contiguous ({n}, {hidden}) tensor (tokens, hidden_size), "
            f"got {tuple(x.shape)}{'' if x.is_contiguous() else ' non-contiguous'}"
        )
    check_tensor("post_layer_mix", post_layer_mix, dtype=torch.float32, device=dev)
    if post_layer_mix.numel() != n * hc or tuple(post_layer_mix.shape[:2]) != (n, hc):
        raise ValueError(
            f"post_layer_mix: expected shape ({n}, {hc}, 1) or ({n}, {hc}), "
            f"got {tuple(post_layer_mix.shape)}"
        )
    if not post_layer_mix.is_contiguous():
        raise ValueError("post_layer_mix: must be contiguous; call .contiguous()")
    check_tensor("comb_res_mix", comb_res_mix, dtype=torch.float32, ndim=3, device=dev)
    if tuple(comb_res_mix.shape) != (n, hc, hc) or not comb_res_mix.is_contiguous():
        raise ValueError(
            f"comb_res_mix: expected a contiguous ({n}, {hc}, {hc}) tensor, "
            f"got {tuple(comb_res_mix.shape)}"
        )
    check_supported_shape(hidden, hc)
    return n, hc, hidden


def mhc_fused_post_pre_delayed(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    pre_mix: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    capture_aux: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One mHC post block followed by the next delayed pre block (vLLM's signature).

    Args (shapes with T tokens, hc = 4 streams, H = hidden_size):
        x: bf16 (T, H), the sublayer output. residual: bf16 (T, hc, H).
        post_layer_mix: fp32 (T, hc, 1); comb_res_mix: fp32 (T, hc, hc), the previous
        sublayer's coefficients. fn: fp32 (hc*(hc+2), hc*H); hc_scale fp32 (3,);
        hc_base fp32 (hc*(hc+2),). pre_mix: fp32 (T, hc) carried pre-mix, or None to
        collapse to stream 0. norm_weight: bf16 (H,) RMSNorm weight of the next layer
        input, or None for the raw collapse. capture_aux: also return the stream mean.

    Returns:
        residual_cur bf16 (T, hc, H) = comb^T-mixed residual + post * x;
        post fp32 (T, hc, 1); comb fp32 (T, hc, hc) (Sinkhorn); layer_input bf16 (T, H)
        (RMSNorm of sum_i pre_mix[i] * residual_cur[i] when norm_weight is given);
        next pre fp32 (T, hc); aux bf16 (T or 0, H).
    """
    n, hc, hidden = _check_post_inputs(x, residual, post_layer_mix, comb_res_mix)
    dev = residual.device
    mix = mix_size(hc)
    check_tensor("fn", fn, dtype=torch.float32, ndim=2, device=dev)
    if tuple(fn.shape) != (mix, hc * hidden) or not fn.is_contiguous():
        raise ValueError(
            f"fn: expected a contiguous ({mix}, {hc * hidden}) fp32 tensor, got {tuple(fn.shape)}"
        )
    check_tensor("hc_scale", hc_scale, dtype=torch.float32, device=dev)
    if tuple(hc_scale.shape) != (3,):
        raise ValueError(f"hc_scale: expected shape (3,), got {tuple(hc_scale.shape)}")
    check_tensor("hc_base", hc_base, dtype=torch.float32, device=dev)
    if tuple(hc_base.shape) != (mix,):
        raise ValueError(f"hc_base: expected shape ({mix},), got {tuple(hc_base.shape)}")
    if pre_mix is not None:
        check_tensor("pre_mix", pre_mix, dtype=torch.float32, ndim=2, device=dev)
        if tuple(pre_mix.shape) != (n, hc) or not pre_mix.is_contiguous():
            raise ValueError(
                f"pre_mix: expected a contiguous ({n}, {hc}) fp32 tensor or None, "
                f"got {tuple(pre_mix.shape)}"
            )
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, dtype=torch.bfloat16, ndim=1, device=dev)
        if tuple(norm_weight.shape) != (hidden,) or not norm_weight.is_contiguous():
            raise ValueError(
                f"norm_weight: expected a contiguous ({hidden},) bf16 tensor or None, "
                f"got {tuple(norm_weight.shape)}"
            )
    if int(sinkhorn_repeat) < 1:
        raise ValueError(f"sinkhorn_repeat: expected >= 1, got {sinkhorn_repeat}")

    residual_cur = torch.empty_like(residual)
    post = torch.empty(n, hc, dtype=torch.float32, device=dev)
    comb = torch.empty(n, hc * hc, dtype=torch.float32, device=dev)
    layer_input = torch.empty(n, hidden, dtype=torch.bfloat16, device=dev)
    next_pre = torch.empty(n, hc, dtype=torch.float32, device=dev)
    aux = torch.empty(n if capture_aux else 0, hidden, dtype=torch.bfloat16, device=dev)
    outputs = (
        residual_cur,
        post.unsqueeze(-1),
        comb.view(n, hc, hc),
        layer_input,
        next_pre,
        aux,
    )
    if n == 0:
        return outputs

    rows = partial_rows(n)
    mix_part = torch.empty(rows, n, mix, dtype=torch.float32, device=dev)
    sq_part = torch.empty(rows, n, dtype=torch.float32, device=dev)
    ysq_part = torch.empty(rows, n, dtype=torch.float32, device=dev)
    post_2d = post_layer_mix.view(n, hc)
    prenorm = get_kernel(fused_variant(n, hidden, hc))
    prenorm(
        comb_res_mix,
        residual,
        post_2d,
        x,
        pre_mix if pre_mix is not None else post_2d,  # not read without a pre-mix
        fn,
        residual_cur,
        layer_input,  # the collapse, normalized in place by the epilogue
        aux if capture_aux else layer_input,  # not written without capture_aux
        mix_part,
        sq_part,
        ysq_part,
        int(pre_mix is not None),
        int(bool(capture_aux)),
    )
    epilogue = get_kernel(
        epilogue_variant(
            hidden,
            hc,
            rows,
            float(rms_eps),
            float(hc_pre_eps),
            float(hc_sinkhorn_eps),
            float(hc_post_mult_value),
            int(sinkhorn_repeat),
            float(norm_eps),
        )
    )
    epilogue(
        mix_part,
        sq_part,
        ysq_part,
        hc_scale,
        hc_base,
        norm_weight if norm_weight is not None else layer_input[0],  # not read without norm
        layer_input,
        post,
        comb,
        next_pre,
        int(norm_weight is not None),
    )
    return outputs


def mhc_post_with_sqrsum(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """mHC post mixing and the sum of squares the next RMS needs, in one pass.

    Args:
        x: bf16 (T, H) sublayer output; residual: bf16 (T, hc, H);
        post_layer_mix: fp32 (T, hc, 1) or (T, hc); comb_res_mix: fp32 (T, hc, hc).

    Returns:
        residual_out: bf16 (T, hc, H), ``residual_out[t, j] = post[t, j] * x[t] +
        sum_i comb[t, i, j] * residual[t, i]`` evaluated in fp32 left to right with every
        product and sum rounded on its own, then rounded to bf16 (``ref.post_fixed_order``
        reproduces it bit for bit);
        sqrsum: fp32 (T,), the sum over the whole ``hc * H`` row of ``residual_out``'s
        (bf16) values squared -- the ``sum x^2`` of the next prenorm RMS.
    """
    n, hc, hidden = _check_post_inputs(x, residual, post_layer_mix, comb_res_mix)
    out = torch.empty_like(residual)
    sqrsum = torch.empty(n, dtype=torch.float32, device=residual.device)
    if n:
        get_kernel(post_variant(hidden, hc))(
            comb_res_mix, residual, post_layer_mix.view(n, hc), x, out, sqrsum, 1
        )
    return out, sqrsum


def mhc_post(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
) -> torch.Tensor:
    """vLLM's ``mhc_post_tilelang(x, residual, post_layer_mix, comb_res_mix)``: the post
    mixing alone, with the fixed operation order of ``mhc_post_with_sqrsum``."""
    n, hc, hidden = _check_post_inputs(x, residual, post_layer_mix, comb_res_mix)
    out = torch.empty_like(residual)
    if n:
        unused_sqrsum = torch.empty(n, dtype=torch.float32, device=residual.device)
        get_kernel(post_variant(hidden, hc))(
            comb_res_mix, residual, post_layer_mix.view(n, hc), x, out, unused_sqrsum, 0
        )
    return out
