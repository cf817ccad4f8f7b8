"""GPU kinds a topology can name: their memory, and the names nvidia-smi prints for them.

A topology says ``gpus.kind: A100-80GB``; people copy what ``nvidia-smi`` shows instead
(``NVIDIA A100-SXM4-80GB``, ``NVIDIA A100 80GB PCIe``, ``NVIDIA RTX A6000``). Both are
accepted and mapped to one canonical kind; anything else is refused with the list.
"""

from __future__ import annotations

import re

MEMORY_GIB = {
    "A100-80GB": 80, "A800-80GB": 80, "A100-40GB": 40, "A800-40GB": 40,
    "GA100-64GB": 64, "A30": 24, "A6000": 48, "A40": 48, "A10": 24,
    "RTX3090": 24, "RTX3090Ti": 24,
    "H200": 140,  # not Ampere: the proxy GPU of the end-to-end comparison (benchmarks/e2e)
}  # fmt: skip

# nvidia-smi's spellings, after the normalization in ``_squash`` (upper case, no vendor
# prefix, no form-factor words, no separators).
_NVIDIA_SMI = {
    "A10080GB": "A100-80GB",
    "A80080GB": "A800-80GB",
    "A10040GB": "A100-40GB",
    "A80040GB": "A800-40GB",
    "GA10064GB": "GA100-64GB",
    "A30": "A30",
    "A3024GB": "A30",
    "RTXA6000": "A6000",
    "A6000": "A6000",
    "A40": "A40",
    "A10": "A10",
    "GEFORCERTX3090": "RTX3090",
    "RTX3090": "RTX3090",
    "GEFORCERTX3090TI": "RTX3090Ti",
    "RTX3090TI": "RTX3090Ti",
    "H200": "H200",
}
_FORM_FACTORS = re.compile(r"SXM\d*|PCIE|NVL|HBM2E?")


def _squash(name: str) -> str:
    s = name.upper().removeprefix("NVIDIA").strip()
    s = _FORM_FACTORS.sub("", s)
    return re.sub(r"[^A-Z0-9]", "", s)


def canonical(name: str) -> str | None:
    """The canonical kind for a topology's or nvidia-smi's name, or None if unknown."""
    if name in MEMORY_GIB:
        return name
    return _NVIDIA_SMI.get(_squash(name))


def unknown_message(name: str) -> str:
    shown = name if len(name) <= 60 else name[:57] + "..."
    return (
        f"unknown GPU {shown!r}; use one of {', '.join(MEMORY_GIB)} (nvidia-smi's names, "
        "e.g. NVIDIA A100-SXM4-80GB, are accepted too)"
    )
