"""Re-import a vLLM module as a CUDA sm_80 process sees it, on a machine with no GPU.

A few vLLM modules define a kernel only under ``if current_platform.is_cuda()``; without a
GPU vLLM resolves another platform and the name does not exist. This module imports such a
module as usual, then re-executes it (``importlib.reload``, that module alone) with a
stand-in platform (CUDA, capability 8.0, no PDL) as vLLM's ``current_platform``. The
stand-in carries no device: use it only to compile kernels ahead of time, in a process of
its own (``ampere_fit`` compiles in a subprocess). Importing vLLM's packages under it
would not work: some call CUDA ops at import.

Attributes are vLLM modules with dots written as ``__``, so a KernelSpec can name such a
kernel as ``tools.vllm_on_sm80:vllm__a__b.kernel_name``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum


class AmpereCompilePlatform(Platform):
    """What vLLM's CUDA platform answers on an A100, for module-level decisions."""

    _enum = PlatformEnum.CUDA
    device_name: str = "cuda"
    device_type: str = "cuda"
    dispatch_key: str = "CUDA"
    ray_device_key: str = "GPU"
    device_control_env_var: str = "CUDA_VISIBLE_DEVICES"

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(major=8, minor=0)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "Ampere stand-in for ahead-of-time compilation"

    @classmethod
    def is_arch_support_pdl(cls) -> bool:
        return False


def module_attribute(module: str) -> str:
    """The attribute of this module that stands for vLLM module ``module``."""
    return module.replace(".", "__")


def reimport_on_cuda(name: str) -> ModuleType:
    """vLLM module ``name``, re-executed with the stand-in CUDA platform."""
    import vllm.platforms as platforms

    module = importlib.import_module(name)
    saved = platforms._current_platform
    platforms.current_platform = AmpereCompilePlatform()
    try:
        return importlib.reload(module)
    finally:
        platforms.current_platform = saved


def __getattr__(name: str) -> ModuleType:
    if name.startswith("vllm__"):
        return reimport_on_cuda(name.replace("__", "."))
    raise AttributeError(name)
