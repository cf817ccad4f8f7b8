"""mHC hyper-connection kernels for Ampere (TileLang): fused post + delayed pre, post + sum x^2.

Importing this package does not import TileLang; kernels compile on first use or through
``warmup.prepare_mhc_kernels`` at startup.
"""

from deepinfer_sm80.ops.mhc.ops import (
    mhc_fused_post_pre_delayed,
    mhc_post,
    mhc_post_with_sqrsum,
)

__all__ = ["mhc_fused_post_pre_delayed", "mhc_post", "mhc_post_with_sqrsum"]
