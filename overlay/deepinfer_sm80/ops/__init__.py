"""Ampere kernels, one folder per op, each with a PyTorch reference in ``ref.py``.

Nothing here imports vLLM: each public op has the signature and semantics of the
vLLM 0.33.0 function it replaces, so the plugin can rebind it.
"""
