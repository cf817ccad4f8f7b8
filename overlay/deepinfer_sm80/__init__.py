"""DeepInfer-SM80: Ampere kernels and a vLLM 0.33.0 plugin for DeepSeek-V4.1."""

__version__ = "0.1.0"
