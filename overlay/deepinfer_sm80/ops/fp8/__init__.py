"""Software OCP e4m3 and UE8M0 for sm80/sm86 (Triton device functions + references)."""

from deepinfer_sm80.ops.fp8.ref import (
    E4M3_MAX,
    e4m3_decode_ref,
    e4m3_encode_ref,
    ue8m0_decode_ref,
)
from deepinfer_sm80.ops.fp8.triton_fp8 import (
    e4m3_to_f32,
    e4m3_ue8m0_to_bf16,
    f32_to_e4m3,
    ue8m0_to_f32,
)

__all__ = [
    "E4M3_MAX",
    "e4m3_decode_ref",
    "e4m3_encode_ref",
    "e4m3_to_f32",
    "e4m3_ue8m0_to_bf16",
    "f32_to_e4m3",
    "ue8m0_decode_ref",
    "ue8m0_to_f32",
]
