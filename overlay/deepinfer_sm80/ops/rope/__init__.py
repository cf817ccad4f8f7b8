"""GPT-J RoPE rounded the way vLLM's kernels round it, shared by the index-Q quantizer
(forward) and the output projection (inverse): Triton device functions and references."""
