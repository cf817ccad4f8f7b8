"""A small, randomly initialized DeepSeek-V4.1 checkpoint that vLLM 0.33.0 loads
through its real safetensors path.

The attention stack keeps the published geometry (hidden 5120, 40 layers, 64 x 512
heads, the compressed/sliding-window layer pattern and its sharing groups); the
parts whose size does not shape the attention path (routed experts, vocabulary,
Engram tables) are shrunk so the checkpoint is a few GB. Tensor names, dtypes and
quantization formats follow what vLLM's DeepSeek-V4.1 loader reads.

``plan`` describes every tensor without allocating it; ``writer`` materializes the
plan shard by shard; ``python -m deepinfer_sm80.smoke_model DIR`` is the command.
"""
