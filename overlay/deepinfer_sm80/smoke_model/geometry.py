"""Model shapes of the smoke checkpoint and the config.json vLLM reads them from.

``full`` keeps the attention geometry of DeepSeek-V4.1-Flash and shrinks the
routed experts, vocabulary and Engram tables. ``tiny`` keeps every tensor name
and format at a reduced geometry for CPU tests; vLLM cannot serve it (its
hidden size and layer pattern differ from what the CUDA kernels are built for).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# vLLM's compressor asserts these (deepseek_v41/compressor.py); both presets keep them.
HEAD_DIM = 512
ROPE_HEAD_DIM = 64
# Both quantized formats store one UE8M0 exponent per 32 values.
QUANT_BLOCK = 32


@dataclass(frozen=True)
class Geometry:
    preset: str
    hidden_size: int
    num_hidden_layers: int
    compress_ratios: tuple[int, ...]  # backbone layers, then the DSpark layers
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    candidate_source_layer_id: int
    candidate_topk_blocks: int
    candidate_block_size: int
    num_attention_heads: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    sliding_window: int
    hc_mult: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_shared_experts: int
    dspark_layers: int
    dspark_n_routed_experts: int
    dspark_num_experts_per_tok: int
    dspark_target_layer_ids: tuple[int, ...]
    dspark_markov_rank: int
    engram_layer_ids: tuple[int, ...]
    engram_n_heads: int
    engram_head_dim: int
    engram_max_ngram_size: int
    engram_vocab_size: int
    max_position_embeddings: int = 1048576
    head_dim: int = HEAD_DIM
    qk_rope_head_dim: int = ROPE_HEAD_DIM
    extra: dict = field(default_factory=dict)

    @property
    def total_layers(self) -> int:
        return self.num_hidden_layers + self.dspark_layers

    def compress_ratio(self, layer: int) -> int:
        return self.compress_ratios[layer] if layer < len(self.compress_ratios) else 0

    def is_kv_source(self, layer: int) -> bool:
        return layer < self.num_hidden_layers and layer in self.kv_source_layer_ids

    def is_index_source(self, layer: int) -> bool:
        return layer < self.num_hidden_layers and layer in self.index_source_layer_ids


FULL = Geometry(
    preset="full",
    hidden_size=5120,
    num_hidden_layers=40,
    compress_ratios=(0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0),
    kv_source_layer_ids=(2, 8, 14, 20),
    index_source_layer_ids=(2, 8, 14, 20, 24, 28, 32, 36),
    candidate_source_layer_id=20,
    candidate_topk_blocks=2048,
    candidate_block_size=8,
    num_attention_heads=64,
    q_lora_rank=1280,
    o_lora_rank=1024,
    o_groups=8,
    # The published config has 32; 64 is the other head count DeepGEMM's indexer
    # kernels accept, and the one the smoke checkpoint exercises by default.
    index_n_heads=64,
    index_head_dim=128,
    index_topk=512,
    sliding_window=128,
    hc_mult=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    # A multiple of 128: the MXFP4 MoE backends round the intermediate size up
    # to 128 (oracle/mxfp4.py), so 128 loads without padding at TP=1.
    moe_intermediate_size=128,
    n_shared_experts=1,
    dspark_layers=3,
    dspark_n_routed_experts=8,
    dspark_num_experts_per_tok=2,
    dspark_target_layer_ids=(37, 38, 39),
    dspark_markov_rank=256,
    engram_layer_ids=(1, 14),
    engram_n_heads=8,
    engram_head_dim=256,
    engram_max_ngram_size=4,
    engram_vocab_size=1000,
)

TINY = Geometry(
    preset="tiny",
    hidden_size=256,
    num_hidden_layers=6,
    compress_ratios=(0, 0, 2, 2, 1, 1, 0, 0, 0),
    kv_source_layer_ids=(2, 4),
    index_source_layer_ids=(2, 4, 5),
    candidate_source_layer_id=4,
    candidate_topk_blocks=64,
    candidate_block_size=8,
    num_attention_heads=4,
    q_lora_rank=64,
    o_lora_rank=64,
    o_groups=2,
    index_n_heads=4,
    index_head_dim=128,
    index_topk=64,
    sliding_window=128,
    hc_mult=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    n_shared_experts=1,
    dspark_layers=3,
    dspark_n_routed_experts=4,
    dspark_num_experts_per_tok=2,
    dspark_target_layer_ids=(3, 4, 5),
    dspark_markov_rank=32,
    engram_layer_ids=(1, 3),
    engram_n_heads=2,
    engram_head_dim=64,
    engram_max_ngram_size=3,
    engram_vocab_size=100,
    max_position_embeddings=65536,
)

PRESETS = {"full": FULL, "tiny": TINY}


def with_index_heads(geometry: Geometry, heads: int) -> Geometry:
    values = asdict(geometry)
    values["index_n_heads"] = heads
    return Geometry(**values)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def engram_primes(geometry: Geometry) -> list[list[int]]:
    """Per Engram layer, the bucket sizes of its (n-gram, head) pairs.

    vLLM derives the same list from the config (``EngramLayout``): primes above
    ``engram_vocab_size - 1`` handed out in order and never reused. A layer's
    table holds exactly the sum of its sizes.
    """
    seen: set[int] = set()
    layers = []
    for _ in geometry.engram_layer_ids:
        sizes = []
        for _ in range(geometry.engram_max_ngram_size - 1):
            current = geometry.engram_vocab_size - 1
            for _ in range(geometry.engram_n_heads):
                current += 1
                while not _is_prime(current) or current in seen:
                    current += 1
                seen.add(current)
                sizes.append(current)
        layers.append(sizes)
    return layers


def engram_num_embeddings(geometry: Geometry) -> list[int]:
    return [sum(sizes) for sizes in engram_primes(geometry)]


def hf_config(geometry: Geometry, vocab: dict) -> dict:
    """config.json in the nested layout vLLM's ``DeepseekV41Config`` flattens.

    ``vocab`` carries the tokenizer-derived ids: vocab_size, bos/eos/pad ids,
    dspark_noise_token_id and engram_compressed_vocab_size.
    """
    g = geometry
    text = {
        "model_type": "deepseek_v41_text",
        "vocab_size": vocab["vocab_size"],
        "hidden_size": g.hidden_size,
        "num_hidden_layers": g.num_hidden_layers,
        "num_nextn_predict_layers": g.dspark_layers,
        "num_attention_heads": g.num_attention_heads,
        "num_key_value_heads": 1,
        "head_dim": g.head_dim,
        "qk_rope_head_dim": g.qk_rope_head_dim,
        "q_lora_rank": g.q_lora_rank,
        "o_lora_rank": g.o_lora_rank,
        "o_groups": g.o_groups,
        "sliding_window": g.sliding_window,
        "max_position_embeddings": g.max_position_embeddings,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "compress_ratios": list(g.compress_ratios),
        "kv_source_layer_ids": list(g.kv_source_layer_ids),
        "index_source_layer_ids": list(g.index_source_layer_ids),
        "candidate_source_layer_id": g.candidate_source_layer_id,
        "candidate_topk_blocks": g.candidate_topk_blocks,
        "candidate_block_size": g.candidate_block_size,
        "index_n_heads": g.index_n_heads,
        "index_head_dim": g.index_head_dim,
        "index_topk": g.index_topk,
        "hc_mult": g.hc_mult,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "n_routed_experts": g.n_routed_experts,
        "num_experts_per_tok": g.num_experts_per_tok,
        "n_shared_experts": g.n_shared_experts,
        "moe_intermediate_size": g.moe_intermediate_size,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "first_k_dense_replace": 0,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-20,
        "tie_word_embeddings": False,
        "bos_token_id": vocab["bos_token_id"],
        "eos_token_id": vocab["eos_token_id"],
        "pad_token_id": vocab["pad_token_id"],
        "engram_layer_ids": list(g.engram_layer_ids),
        "engram_num_embeddings": engram_num_embeddings(g),
        "engram_max_ngram_size": g.engram_max_ngram_size,
        "engram_vocab_size": g.engram_vocab_size,
        "engram_n_heads": g.engram_n_heads,
        "engram_head_dim": g.engram_head_dim,
        "engram_pad_token_id": vocab["pad_token_id"],
        "engram_compressed_vocab_size": vocab["engram_compressed_vocab_size"],
        "dspark_block_size": 5,
        "dspark_target_layer_ids": list(g.dspark_target_layer_ids),
        "dspark_markov_rank": g.dspark_markov_rank,
        "dspark_noise_token_id": vocab["dspark_noise_token_id"],
        "dspark_n_routed_experts": g.dspark_n_routed_experts,
        "dspark_num_experts_per_tok": g.dspark_num_experts_per_tok,
    }
    vision = {
        "model_type": "deepseek_v41_vision",
        "num_hidden_layers": 32,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "intermediate_size": 2816,
        "patch_size": 14,
        "max_image_tokens": 1024,
    }
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "text_config": text,
        "vision_config": vision,
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": [QUANT_BLOCK, QUANT_BLOCK],
            "expert_dtype": "fp4",
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
