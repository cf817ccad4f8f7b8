"""Pipeline relay of DeepSeek-V4.1's layer-source caches across pipeline stages.

``records`` (pure torch: per-slot record gather/scatter) has no vLLM import; ``mirror``
and ``relay`` import vLLM and are loaded by the plugin's ledger only.
"""
