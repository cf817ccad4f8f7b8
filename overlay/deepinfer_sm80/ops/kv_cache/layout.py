"""The 584-byte V4 KV record, which vLLM 0.33.0 uses for DeepSeek-V4.1 off SM100.

A page of ``block_size`` tokens holds every token's 576 data bytes first, then every
token's 8 scale bytes, then padding up to ``k_cache.stride(0)`` (vLLM rounds pages to a
multiple of 576 bytes):

    data row  (576 B): 448 NoPE values as e4m3fn bytes | 64 RoPE values as bf16 (128 B)
    scale row (8 B)  : 7 UE8M0 bytes, one per 64 NoPE dims | 1 zero pad byte

Source: ``vllm/models/deepseek_v41/common/ops/cache_utils.py`` (vLLM 0.33.0), module
header and ``quantize_and_insert_k_kernel``.
"""

HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
QUANT_BLOCK = 64
NUM_SCALES = NOPE_DIM // QUANT_BLOCK  # 7
SCALE_BYTES = 8  # 7 scales + 1 pad byte
DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
RECORD_BYTES = DATA_BYTES + SCALE_BYTES  # 584
PAGE_ALIGNMENT = 576

# Widths vLLM 0.33.0 also recognises, for clear refusals (SM100-only formats).
V41_MXFP8_RECORD_BYTES = 528
V41_NVFP4_RECORD_BYTES = 288


def page_bytes(block_size: int) -> int:
    """Bytes of one page as vLLM allocates it: records rounded up to 576."""
    raw = block_size * RECORD_BYTES
    return -(-raw // PAGE_ALIGNMENT) * PAGE_ALIGNMENT
