"""Error budgets for non-bit-exact kernels, relative to PyTorch in the same precision.

``ulp_error`` measures ``|x - ref|`` in bf16 ulps of each reference element's magnitude
(bf16 has 8 significant bits: ulp(v) = 2**(floor(log2|v|) - 7)). Elements far below
their row's magnitude would make any rounding look huge, so magnitudes are floored at
``rel_floor`` times the row's largest magnitude. ``assert_within_torch_budget`` requires
the kernel's worst error to be no worse than ``factor`` times PyTorch's own worst error
doing the same maths in bf16 (and reports both, plus max abs error, on failure).
"""

import torch


def ulp_error(x: torch.Tensor, ref: torch.Tensor, rel_floor: float = 1e-3) -> torch.Tensor:
    """Per-element error in bf16 ulps; rows are the last dimension."""
    ref = ref.double()
    mag = ref.abs()
    floor = mag.amax(dim=-1, keepdim=True) * rel_floor
    mag = torch.maximum(mag, floor).clamp_min(2.0**-126)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
    return (x.double() - ref).abs() / ulp


def assert_within_torch_budget(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    torch_same_precision: torch.Tensor,
    factor: float = 2.0,
) -> dict:
    """Fail unless max ulp error of ``got`` <= factor x that of ``torch_same_precision``."""
    assert not torch.isnan(got).any(), f"{name}: NaN in the output"
    err = ulp_error(got, ref)
    err_torch = ulp_error(torch_same_precision, ref)
    report = {
        "max_ulp": float(err.max()),
        "torch_max_ulp": float(err_torch.max()),
        "max_abs": float((got.double() - ref.double()).abs().max()),
        "torch_max_abs": float((torch_same_precision.double() - ref.double()).abs().max()),
    }
    # Torch's bf16 error can be 0 on trivial inputs; half an ulp is the floor any
    # bf16 output pays for its own rounding.
    budget = factor * max(report["torch_max_ulp"], 0.5)
    worst = tuple(int(i) for i in (err == err.max()).nonzero()[0])
    assert report["max_ulp"] <= budget, (
        f"{name}: {report['max_ulp']:.2f} ulp > {factor} x PyTorch-bf16 "
        f"{report['torch_max_ulp']:.2f} ulp at {worst}; max abs {report['max_abs']:.3g} "
        f"(PyTorch {report['torch_max_abs']:.3g})"
    )
    return report
