"""The patch ledger: every change the overlay makes to vLLM, as data.

Pure data (no vLLM import), so ``deepinfer doctor --patches`` can print it anywhere.
Each entry names the vLLM symbols it rebinds -- where they are *used*, since vLLM
modules bind names at import (``from ... import f``) -- the replacement with the same
signature, why, the vLLM version it was verified against, and when it can go.
"""

from __future__ import annotations

from dataclasses import dataclass

VERIFIED_VLLM = "0.33.0"

_V41 = "vllm.models.deepseek_v41"


@dataclass(frozen=True)
class LedgerEntry:
    name: str
    targets: tuple[str, ...]  # "module:attribute" for every place the name is bound
    replacement: str  # "module:attribute" of ours, same signature
    reason: str
    remove_when: str
    # "function": rebind a Python function with vLLM's signature at every target;
    # "kernel": a Triton kernel replaced through vllm.triton_utils.dispatcher.register_kernels,
    # the replacement taking the kernel's launch arguments by name.
    level: str = "function"
    verified: str = VERIFIED_VLLM


LEDGER: tuple[LedgerEntry, ...] = (
    LedgerEntry(
        name="kv-gather",
        targets=(
            f"{_V41}.common.ops.cache_utils:dequantize_and_gather_k_cache",
            f"{_V41}.common.ops:dequantize_and_gather_k_cache",
            f"{_V41}.nvidia.flashmla:dequantize_and_gather_k_cache",
            f"{_V41}.nvidia.flash_mla_mega_attn:dequantize_and_gather_k_cache",
        ),
        replacement="deepinfer_sm80.ops.kv_cache:dequantize_and_gather_k_cache",
        reason="vLLM picks a CuteDSL gather (cvt e4m3x2, sm89+) whenever cutlass imports, and "
        "its Triton fallback bitcasts to fp8e4nv, which Triton refuses below sm89",
        remove_when="vLLM ships an sm80 path for the V4 record gather",
    ),
    LedgerEntry(
        name="kv-insert",
        targets=(
            f"{_V41}.common.ops.cache_utils:quantize_and_insert_k_cache",
            f"{_V41}.common.ops:quantize_and_insert_k_cache",
        ),
        replacement="deepinfer_sm80.ops.kv_cache:quantize_and_insert_k_cache",
        reason="vLLM's generic K insert converts to fp8e4nv, which Triton refuses below sm89",
        remove_when="vLLM's insert compiles for sm80",
    ),
    LedgerEntry(
        name="topk-swa-combine",
        targets=(
            f"{_V41}.common.ops.cache_utils:combine_topk_swa_indices",
            f"{_V41}.common.ops:combine_topk_swa_indices",
            f"{_V41}.nvidia.flashmla:combine_topk_swa_indices",
            f"{_V41}.nvidia.flash_mla_mega_attn:combine_topk_swa_indices",
        ),
        replacement="deepinfer_sm80.ops.topk_swa:combine_topk_swa_indices",
        reason="one CTA per query token writes its row as three disjoint regions, with no "
        "torch.full(-1) pass first. vLLM's CombineTopkSwaIndicesKernel (JIT-warmup owner) is "
        "kept: it is integer-only, compiles on sm80 and is no longer launched; overriding it "
        "through register_kernels would break its warmup (KernelOverride has no .warmup)",
        remove_when="the original's combiner lands upstream",
    ),
    LedgerEntry(
        name="global-topk",
        targets=(
            f"{_V41}.common.ops.cache_utils:compute_global_topk_indices_and_lens",
            f"{_V41}.common.ops:compute_global_topk_indices_and_lens",
            f"{_V41}.nvidia.flashmla:compute_global_topk_indices_and_lens",
            f"{_V41}.nvidia.flash_mla_mega_attn:compute_global_topk_indices_and_lens",
            f"{_V41}.nvidia.flashinfer_sparse:compute_global_topk_indices_and_lens",
        ),
        replacement="deepinfer_sm80.ops.topk_swa:compute_global_topk_indices_and_lens",
        reason="same results from a kernel sized to the row width (vLLM: a fixed 1024 block); "
        "keeps every index op of the Ampere path in one tested package",
        remove_when="no Ampere-specific change is needed: drop when it stops paying off",
    ),
    LedgerEntry(
        name="attention",
        targets=(f"{_V41}.nvidia.model:_select_dsv4_attn_cls",),
        replacement="deepinfer_sm80.vllm_plugin.attention:select_dsv4_attn_cls",
        reason="on SM8x vLLM builds DeepseekV4FlashMLAAttention, whose FlashMLA decode and "
        "prefill have sm90a/sm100 code only; ours is that layer with our sparse MLA on the "
        "real heads, declaring its own backends: no FlashMLA tile scheduler in the SWA "
        "metadata, and FLASHMLA_SPARSE_DSV41's capability check widened to 8.x",
        remove_when="vLLM selects a DeepSeek-V4.1 attention layer that runs on sm80",
    ),
    LedgerEntry(
        name="indexer-mqa-logits",
        targets=(
            "vllm.model_executor.layers.sparse_attn_indexer:fp8_fp4_mqa_logits",
            "vllm.utils.deep_gemm:fp8_fp4_mqa_logits",
            "vllm.models.glm5next.nvidia.sparse_indexer:fp8_fp4_mqa_logits",
        ),
        replacement="deepinfer_sm80.ops.indexer_logits:fp8_fp4_mqa_logits",
        reason="DeepGEMM's fp8_fp4_mqa_logits has sm90+ code only; ours decodes the e4m3 "
        "index keys in software (exactly, to fp16) for Tensor Core dots: same compressed "
        "row layout, fp32 logits",
        remove_when="vLLM or DeepGEMM ship an sm80 MQA-logits path",
    ),
    LedgerEntry(
        name="indexer-paged-mqa-logits",
        targets=(
            "vllm.model_executor.layers.sparse_attn_indexer:fp8_fp4_paged_mqa_logits",
            "vllm.utils.deep_gemm:fp8_fp4_paged_mqa_logits",
            f"{_V41}.nvidia.specialized_decode.attention.indexer:fp8_fp4_paged_mqa_logits",
            "vllm.models.glm5next.nvidia.sparse_indexer:fp8_fp4_paged_mqa_logits",
        ),
        replacement="deepinfer_sm80.ops.indexer_logits:fp8_fp4_paged_mqa_logits",
        reason="DeepGEMM's paged MQA logits has sm90+ code only; ours reads the fp8 index-K "
        "pages directly and writes logits up to each row's length, -inf to the request's",
        remove_when="vLLM or DeepGEMM ship an sm80 paged MQA-logits path",
    ),
    LedgerEntry(
        name="indexer-paged-metadata",
        targets=(
            "vllm.v1.attention.backends.mla.indexer:get_paged_mqa_logits_metadata",
            "vllm.utils.deep_gemm:get_paged_mqa_logits_metadata",
            f"{_V41}.nvidia.specialized_decode.attention.indexer:get_paged_mqa_logits_metadata",
        ),
        replacement="deepinfer_sm80.ops.indexer_logits:get_paged_mqa_logits_metadata",
        reason="the indexer's metadata builder calls DeepGEMM's scheduler (sm90+) every decode "
        "step; our paged kernel needs no schedule, so this returns the zeros vLLM copies",
        remove_when="the indexer-paged-mqa-logits entry is removed",
    ),
    LedgerEntry(
        name="indexer-k-store",
        targets=(
            f"{_V41}.common.ops.indexer_k_store:indexer_k_norm_rope_store",
            f"{_V41}.common.ops:indexer_k_norm_rope_store",
            f"{_V41}.attention:indexer_k_norm_rope_store",
        ),
        replacement="deepinfer_sm80.ops.cache_writers:indexer_k_norm_rope_store",
        reason="vLLM's index-K writer (norm + RoPE + fp8 quantization) converts to fp8e4nv, "
        "which Triton refuses below sm89; ours encodes e4m3 in software, same bytes (the "
        "MXFP4 index cache needs sm100 and is refused with a message)",
        remove_when="vLLM's indexer K writer compiles for sm80",
    ),
    LedgerEntry(
        name="compressed-kv-insert",
        targets=(
            f"{_V41}.common.ops.fused_compress_quant_cache:rope_quant_insert",
            f"{_V41}.compressor:rope_quant_insert",
        ),
        replacement="deepinfer_sm80.ops.cache_writers:rope_quant_insert",
        reason="vLLM's compressed-cache insert (the 584-byte V4 record, fp8_ds_mla off SM100) "
        "converts to fp8e4nv, which Triton refuses below sm89; ours writes the same bytes",
        remove_when="vLLM's compressed-cache insert compiles for sm80",
    ),
    LedgerEntry(
        name="indexer-q-quant",
        targets=(
            "vllm.models.deepseek_v4.common.ops.fused_indexer_q:fused_indexer_q_rope_quant",
            "vllm.models.deepseek_v4.common.ops:fused_indexer_q_rope_quant",
            f"{_V41}.common.ops:fused_indexer_q_rope_quant",
            f"{_V41}.attention:fused_indexer_q_rope_quant",
            f"{_V41}.nvidia.specialized_decode.attention.indexer:fused_indexer_q_rope_quant",
        ),
        replacement="deepinfer_sm80.ops.indexer_q:fused_indexer_q_rope_quant",
        reason="vLLM's fp8 index-Q path runs a CuteDSL kernel whenever cutlass imports (cvt "
        "e4m3x2: ptxas needs sm90), and its Triton fallback converts to fp8e4nv (refused below "
        "sm89); function level, since the CuteDSL branch runs before any Triton kernel",
        remove_when="vLLM's index-Q quantizer compiles for sm80",
    ),
    LedgerEntry(
        name="inv-rope",
        targets=(
            "vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant:fused_inv_rope_fp8_quant",
            "vllm.models.deepseek_v4.common.ops:fused_inv_rope_fp8_quant",
            f"{_V41}.common.ops:fused_inv_rope_fp8_quant",
            "vllm.models.deepseek_v4.nvidia.ops.o_proj:fused_inv_rope_fp8_quant",
        ),
        replacement="deepinfer_sm80.ops.inv_rope:fused_inv_rope_fp8_quant",
        reason="o_proj calls it with quantize=False on sm80 (wo_a dequantized to bf16 at load), "
        "but vLLM's kernel still holds its fp8e4nv conversion and fails to compile below "
        "sm89; function level because KernelOverride drops the launch grid",
        remove_when="vLLM's inverse-RoPE kernel compiles for sm80",
    ),
    LedgerEntry(
        name="mhc-fused-post-pre",
        targets=(
            f"{_V41}.nvidia.ops.mhc:mhc_fused_post_pre_delayed_tilelang",
            "vllm.model_executor.kernels.mhc.tilelang:mhc_fused_post_pre_delayed_tilelang",
        ),
        replacement="deepinfer_sm80.ops.mhc:mhc_fused_post_pre_delayed",
        reason="vLLM's Ampere mHC runs the prenorm GEMM unsplit on fp32 CUDA cores (DeepGEMM's "
        "TF32 path is sm90+): ours splits it in 8 slices of 640 at every token count and "
        "uses TF32 T.gemm from 16 tokens; 1.9-2.7x vs vLLM's strategy rebuilt (H200)",
        remove_when="vLLM's Ampere mHC path splits the prenorm GEMM and uses Tensor Cores",
    ),
    LedgerEntry(
        name="mhc-post",
        targets=(
            f"{_V41}.nvidia.model:mhc_post_tilelang",
            f"{_V41}.nvidia.dspark:mhc_post_tilelang",
            "vllm.model_executor.kernels.mhc.tilelang:mhc_post_tilelang",
        ),
        replacement="deepinfer_sm80.ops.mhc:mhc_post",
        reason="the post mixing at Engram boundaries, the last layer and DSpark, in one pass "
        "with a fixed fp32 operation order (bit-exact against its reference)",
        remove_when="no Ampere-specific need: drop when it stops paying off",
    ),
    LedgerEntry(
        name="kernel-warmup",
        targets=("vllm.v1.worker.gpu_worker:warmup_kernels",),
        replacement="deepinfer_sm80.vllm_plugin.warmup:warmup_kernels",
        reason="compile (or load from the image's AOT folder) every mHC TileLang variant up to "
        "max_num_batched_tokens before vLLM's own warmup, and after it run one prefill long "
        "enough for the indexer to score, so no compile lands on a request",
        remove_when="the mhc entries are removed and vLLM warms DeepSeek-V4.1's scored prefill",
    ),
    LedgerEntry(
        name="indexer-pack-seq",
        targets=("vllm.model_executor.layers.sparse_attn_indexer:pack_seq_triton",),
        replacement="deepinfer_sm80.vllm_plugin.pack_seq:pack_seq_triton",
        reason="with uneven decode rows the indexer pads its float8_e4m3fn queries with "
        "pack_seq_triton, whose kernel types them *fp8e4nv (refused below sm89); ours packs "
        "the same bytes through vLLM's uint8 path (pad byte 0; padded slots are masked)",
        remove_when="vLLM's pack_seq_triton handles fp8 without fp8e4nv",
    ),
    LedgerEntry(
        name="dspark-pp-embedding",
        targets=(
            "vllm.models.deepseek_v41:DSparkDeepseekV4ForCausalLM",
            f"{_V41}.nvidia.dspark:DSparkDeepseekV4ForCausalLM",
        ),
        replacement="deepinfer_sm80.vllm_plugin.dspark_pp:DSparkPPDeepseekV4ForCausalLM",
        reason="with PP > 1 the target's embedding is missing on the last stage, where the "
        "DSpark draft lives, and vLLM stops at draft load ('needs the target input "
        "embedding'); ours is vLLM's draft class loading its own copy of embed.weight under "
        "PP > 1 (1.32 GB / TP on the last stage), unchanged at PP 1",
        remove_when="vLLM's DSpark draft loads its embedding under PP",
    ),
    LedgerEntry(
        name="pp-broadcast-steady",
        targets=("vllm.v1.worker.gpu.model_runner:PPHandler",),
        replacement="deepinfer_sm80.vllm_plugin.pp_broadcast:SteadyPPHandler",
        reason="with PP > 1 the sampled-token width (1 or K+1) and the alignment of the "
        "rejected counts ([2, num_reqs] int32) vary per step, so the non-last ranks' "
        "post-update Triton kernel can compile mid-serving, the hang vLLM #56956 fixed; "
        "ours is vLLM's PPHandler handing out fixed-width, aligned outputs (one variant, "
        "pre-warmed by kernel-warmup); the wire format is unchanged",
        remove_when="vLLM pads the PP broadcast and pre-warms post_update (#56956)",
    ),
    LedgerEntry(
        name="engram-lookup",
        targets=(f"{_V41}.common.engram:_engram_lookup_kernel",),
        replacement="deepinfer_sm80.ops.engram:engram_lookup_kernel_override",
        reason="the Engram tables are float8_e4m3fn, so Triton types vLLM's lookup kernel's "
        "table pointer *fp8e4nv, which it refuses below sm89; ours reads the bytes as uint8 "
        "and decodes e4m3 in software (bit-exact), while vLLM's lookup() keeps its grid, "
        "sorting and storage modes",
        remove_when="vLLM's Engram lookup compiles for sm80",
        level="kernel",
    ),
    LedgerEntry(
        name="pp-relay",
        targets=(
            f"{_V41}.nvidia.model:DeepseekV41LLMForCausalLM",
            f"{_V41}.nvidia.vl_model:DeepseekV41LLMForCausalLM",
        ),
        replacement="deepinfer_sm80.vllm_plugin.pp_relay.relay:"
        "PipelineRelayDeepseekV41LLMForCausalLM",
        reason="a pipeline cut inside a sharing group (14,14,12 cuts at 28, inside 20-39) "
        "makes vLLM raise NotImplementedError at construction (attention.py:462-468, "
        "605-613): ours is vLLM's class with model_cls = a DeepseekV4Model subclass that "
        "registers same-name mirrors of layer 20's caches before make_layers and relays "
        "the records written each step in the PP IntermediateTensors. Inert at PP=1, for "
        "cuts that cross nothing, and until relays_shared_kv (or DEEPINFER_PP_RELAY=1)",
        remove_when="vLLM serves PP splits inside a DeepSeek-V4.1 kv-sharing group",
    ),
)


def entry_names() -> list[str]:
    return [e.name for e in LEDGER]


def format_ledger(statuses: dict[str, str] | None = None) -> str:
    """The ledger as a table; ``statuses`` (name -> applied/skipped: why) when known."""
    lines = [f"{'patch':18} {'status':28} targets / reason"]
    for e in LEDGER:
        status = (statuses or {}).get(e.name, f"verified on vLLM {e.verified}")
        lines.append(f"{e.name:18} {status[:28]:28} {len(e.targets)} targets -> {e.replacement}")
        lines.append(f"{'':18} {'':28} why: {e.reason}")
    return "\n".join(lines)
