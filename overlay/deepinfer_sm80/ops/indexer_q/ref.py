"""PyTorch reference for the index-Q RoPE + fp8 quantizer.

``indexer_q_rope_quant_ref`` follows vLLM 0.33.0's ``fused_indexer_q_rope_quant`` (fp8
path) step by step, in the same fp32 operations:

1. GPT-J RoPE on the last ``rope_dim`` dims of each head (pairs ``(2i, 2i+1)``,
   ``cos``/``sin`` = the two halves of the cache row at the token's position), rounded
   to bf16; the leading dims pass through.
2. ``scale = 2**ceil(log2(max(amax, 1e-4) / 448))`` per (token, head), amax over the
   whole head after step 1.
3. Bytes = e4m3fn of ``x / scale`` (round to nearest even; ``|x / scale| <= 448`` by
   construction, so nothing saturates).
4. ``weights_out = ((weights * scale) * softmax_scale) * head_scale`` in fp32, the
   Python scales rounded to fp32 first, as a Triton launch does.

Step 1 is computed two ways: ``contract=False`` rounds the products and the sum
separately (PyTorch's ``forward_native``, and any kernel under Triton's CPU
interpreter); ``contract=True`` fuses one product of each output into an FMA the way
vLLM's kernel compiles on a GPU (``ops/rope/ref.py``). Both are bit-exact models.
"""

import torch

from deepinfer_sm80.ops.fp8.ref import e4m3_encode_ref
from deepinfer_sm80.ops.rope.ref import rope_rows

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4


def indexer_q_rope_quant_ref(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    index_q_cos_sin_cache: torch.Tensor,
    index_weights: torch.Tensor,
    index_weights_softmax_scale: float,
    index_weights_head_scale: float,
    contract: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3fn bytes ``[T, H, D]`` uint8, ``weights_out [T, H]`` fp32, ``scale [T, H]``)."""
    nope = index_q.shape[-1] - index_q_cos_sin_cache.shape[-1]
    x = rope_rows(index_q.float(), positions, index_q_cos_sin_cache, contract=contract)
    # The rotated dims are materialized as bf16 before the amax (vLLM does the same).
    x = torch.cat([x[..., :nope], x[..., nope:].to(torch.bfloat16).float()], dim=-1)
    amax = x.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    q_bytes = e4m3_encode_ref(x / scale[..., None])
    f32 = lambda v: torch.tensor(v, dtype=torch.float32, device=index_weights.device)  # noqa: E731
    weights = index_weights.float() * scale
    weights = weights * f32(index_weights_softmax_scale)
    weights = weights * f32(index_weights_head_scale)
    return q_bytes, weights, scale
