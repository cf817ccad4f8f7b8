"""End-to-end serving benchmark for an OpenAI-compatible (vLLM) server: the original
DeepInfer-SM80 workloads (cold prefill, Python-code decode, four-stream speculative decode,
long generation, KV capacity) plus a prompt-NLL check. See README.md in this folder."""
