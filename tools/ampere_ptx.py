"""Run Triton kernels as Ampere code on a newer NVIDIA GPU (tests and benchmarks only).

With ``enable()`` active, Triton runs its sm_80 pipeline for every kernel
(``TRITON_OVERRIDE_ARCH=sm80``: the TTGIR is made for ``cuda:80``, so Ampere's
``mma.sync`` layouts and shared-memory plan, no wgmma or TMA), and the PTX it emits is
handed to the driver as PTX (no cubin), which JIT-compiles it for the GPU at hand.

Why: Triton lowers a kernel for sm_90 differently, and a figure measured that way may
say little about Ampere. In this mode the kernel's structure is Ampere's; LLVM and the
driver still emit and schedule the newer GPU's machine code (Triton 3.6-3.8 tag the
PTX with the GPU's own target), so registers, scheduling, bandwidth and clocks are the
newer GPU's. Figures measured this way are labelled ``sm_80 PTX (JIT)`` and are never
presented as Ampere figures. For our sparse MLA kernel (16-row dots, which sm_90 cannot
feed to wgmma either) both lowerings timed the same on an H200.

Switch: ``DEEPINFER_AMPERE_PTX=1`` for ``benchmarks/`` and ``make test-gpu``.
"""

import os

ENV = "DEEPINFER_AMPERE_PTX"
LABEL = "sm_80 PTX (JIT)"
_enabled = False


def requested() -> bool:
    return os.environ.get(ENV, "0") == "1"


def enable() -> None:
    """Make every later Triton compile in this process target sm_80 and load as PTX."""
    global _enabled
    if _enabled:
        return
    import triton
    from triton.backends.nvidia.compiler import CUDABackend

    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(runtime, "override_arch"):
        raise RuntimeError(
            f"{ENV}=1 needs triton.knobs.runtime.override_arch (Triton >= 3.4); this is "
            f"Triton {triton.__version__}. Unset {ENV} to run the native lowering."
        )
    runtime.override_arch = "sm80"

    def ptx_instead_of_cubin(self, src, metadata, *args, **kwargs):
        # cuModuleLoadData takes NUL-terminated PTX text as well as a cubin.
        return src.encode() + b"\0"

    CUDABackend.make_cubin = ptx_instead_of_cubin
    _enabled = True


def enable_if_requested() -> str | None:
    """``enable()`` when ``DEEPINFER_AMPERE_PTX=1``; returns the label to report, or None."""
    if not requested():
        return None
    enable()
    return LABEL
