"""How DeepSeek-V4.1 launches the vLLM Triton kernels left on its SM80 path, as data.

One entry per kernel the coverage walk leaves to compile (``sm80_coverage.Coverage.
kernels_to_check``), each a list of launches read from the call site named in it:
argument types (Triton's: ``*bf16``, ``*i32``, ``i32``, ``fp32``...), constexpr values at
V4.1-Flash's production shapes on our deployment (hidden 5120, q_lora_rank 1280, head_dim
512, 384 routed experts / 128 in DSpark, top-k 512, window 128, candidate blocks 2048 x 8,
compress ratios 1 and 2, DSpark K=5 so decode rows come in groups of 6, block size 256,
no DCP), ``num_warps`` / ``num_stages`` as launched (Triton's defaults 4 / 3 where the
call passes none). Where a constexpr takes a range at run time, the smallest and the
largest value are listed.

Triton specializes some run-time values and so must we: an integer argument equal to 1
(a unit stride, a DCP world of 1) becomes the constexpr 1, ``None`` becomes the constexpr
``None``, and integers that are multiples of 16 in production go in ``div16``.

Non-constexpr arguments not named in ``types`` are ``i32`` (sizes, strides, counts); every
pointer must be named (one whose name ends in ``ptr`` is checked here, any other fails to
compile as an ``i32``). Call sites of ``VllmJitKernel`` owners point at their
``__call__``. ``tests/tools/test_sm80_coverage.py`` fails when a kernel on the path has
no entry, when an entry's kernel is no longer on the path, and when an entry
names an argument the kernel does not have or misses a constexpr it has.

``VLLM_TILELANG_LAUNCHES`` does the same for vLLM's TileLang kernels on the path: the
compile-time parameters of each specialization V4.1 compiles on SM8x, checked against
vLLM's own dispatch and JIT-warmup keys (``tilelang_dispatch_problems``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from deepinfer_sm80.kernel_spec import KernelSpec

# Resolves a vLLM module re-executed on a stand-in CUDA platform (imported only in the
# compile subprocess, never here): attribute = the module's name with dots as "__".
_VLLM_ON_SM80 = "tools.vllm_on_sm80"


@dataclass(frozen=True)
class Launch:
    """One way the kernel is launched on the path."""

    variant: str  # short label, e.g. "ratio=2"
    call_site: str  # "vllm/...py:LINE" of the launch (or of the owner's __call__)
    types: dict[str, str] = field(default_factory=dict)
    constexprs: dict[str, int | bool | float | None] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    div16: tuple[str, ...] = ()
    # the kernel is defined under `if current_platform.is_cuda()`: resolve it through
    # tools.vllm_on_sm80
    cuda_only_definition: bool = False
    # wrappers around the JITFunction (triton.autotune / triton.heuristics), each with a
    # ``.fn``; an autotuned kernel gets one launch per config of its list
    unwrap: int = 0


_I32 = "*i32"
_DSPARK_ROWS = 6  # 1 + num_speculative_tokens: decode rows that share one request's bounds

_CB = "vllm/model_executor/kernels/attention/dsa/candidate_blocks.py"
_SWA = "vllm/v1/attention/backends/mla/sparse_swa.py"
_ENGRAM = "vllm/models/deepseek_v41/common/engram.py"
_FCQC = "vllm/models/deepseek_v41/common/ops/fused_compress_quant_cache.py"
_MODEL_STATE = "vllm/models/deepseek_v41/nvidia/model_state.py"
_FCQC_MODULE = "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache"


def _candidate_launches() -> dict[str, list[Launch]]:
    """Candidate-block scoring of V4.1's indexers (candidate source L20, consumers
    24/28/32/36): fp32 logits, int32 bounds, block size 8, 2048 candidate blocks; prefill
    rows have their own starts, decode rows share bounds in groups of 6."""
    prefill = {"HAS_STARTS": True, "ROW_REPEAT": 1}
    decode = {"starts": None, "HAS_STARTS": False, "ROW_REPEAT": _DSPARK_ROWS}
    return {
        "vllm.model_executor.kernels.attention.dsa.candidate_blocks:_block_scores_kernel": [
            Launch(
                name,
                f"{_CB}:194",
                {
                    "logits": "*fp32",
                    "starts": _I32,
                    "ends": _I32,
                    "scores": "*fp32",
                    "valid_blocks": _I32,
                },
                {**rows, "stride_col": 1, "BLOCK_SIZE": 8, "TILE": 128, "FULL_WIDTH": True},
            )
            for name, rows in (("prefill", prefill), ("decode", decode))
        ],
        "vllm.model_executor.kernels.attention.dsa.candidate_blocks:_candidate_flags_kernel": [
            Launch(
                name,
                f"{_CB}:244",
                {"candidates": _I32, "starts": _I32, "flags": "*u8"},
                {**rows, "stride_col": 1, "BLOCK_SIZE": 8, "K": 2048},
            )
            for name, rows in (("prefill", prefill), ("decode", decode))
        ],
        "vllm.model_executor.kernels.attention.dsa.candidate_blocks:_mask_candidates_kernel": [
            Launch(
                name,
                f"{_CB}:257",
                {"logits": "*fp32", "starts": _I32, "ends": _I32, "flags": "*u8"},
                {**rows, "stride_col": 1, "BLOCK_SIZE": 8, "TILE": 1024},
            )
            for name, rows in (("prefill", prefill), ("decode", decode))
        ],
        "vllm.model_executor.kernels.attention.dsa.candidate_blocks:_store_candidates_kernel": [
            Launch(
                "topk=2048",
                f"{_CB}:217",
                # torch.topk values (fp32) and indices (int64) into the int32 buffer
                {"values": "*fp32", "indices": "*i64", "output": _I32},
                {"out_stride_col": 1, "OUT_K": 2048, "TILE": 256},
            )
        ],
    }


def _mla_metadata_launches() -> dict[str, list[Launch]]:
    """Integer metadata builders of the sparse-MLA, SWA and indexer backends."""
    ratios = (1, 2)
    return {
        "vllm.models.deepseek_v41.common.ops.cache_utils:CombineTopkSwaIndicesKernel.kernel": [
            Launch(
                f"ratio={ratio}",
                "vllm/models/deepseek_v41/common/ops/cache_utils.py:1206",
                {
                    p: _I32
                    for p in (
                        "combined_indices_ptr",
                        "combined_lens_ptr",
                        "topk_indices_ptr",
                        "query_start_loc_ptr",
                        "seq_lens_ptr",
                        "gather_lens_ptr",
                    )
                },
                {
                    "TOP_K": 512 if ratio else 0,
                    "COMPRESS_RATIO": ratio,
                    "WINDOW_SIZE": 128,
                    "PADDED_TOP_K": 512,
                },
            )
            for ratio in (0, 1, 2)
        ],
        "vllm.v1.attention.backends.mla.compressor_utils:CompressedSlotMappingKernel.kernel": [
            Launch(
                f"ratio={ratio}",
                "vllm/v1/attention/backends/mla/compressor_utils.py:166",
                {
                    "compressed_slot_mapping_ptr": "*i64",
                    "slot_mapping_ptr": "*i64",
                    "query_start_loc_ptr": _I32,
                    "seq_lens_ptr": _I32,
                    "block_table_ptr": _I32,
                },
                # block_size 256 // ratio; no DCP, so world size and interleave are 1
                {
                    "dcp_world_size": 1,
                    "cp_interleave": 1,
                    "COMPRESS_RATIO": ratio,
                    "PAD_ID": -1,
                    "TRITON_BLOCK_SIZE": 1024,
                },
                div16=("block_size",),
            )
            for ratio in ratios
        ],
        "vllm.v1.attention.backends.mla.indexer:BuildPrefillChunkMetadataKernel.kernel": [
            Launch(
                f"ratio={ratio}",
                "vllm/v1/attention/backends/mla/indexer.py:685",
                {
                    p: _I32
                    for p in (
                        "query_start_loc_ptr",
                        "uncompressed_seq_lens_ptr",
                        "cu_compressed_seq_lens_ptr",
                        "row_start_cu_compressed_seq_lens_ptr",
                        "token_to_seq_ptr",
                        "cu_compressed_seq_len_ks_ptr",
                        "cu_compressed_seq_len_ke_ptr",
                    )
                },
                {"DCP_WORLD": 1, "DCP_INTERLEAVE": 1, "BLOCK_SIZE": 1024, "COMPRESS_RATIO": ratio},
            )
            for ratio in ratios
        ],
        "vllm.v1.attention.backends.mla.indexer:PrepareUniformDecodeKernel.kernel": [
            Launch(
                "uniform decode",
                "vllm/v1/attention/backends/mla/indexer.py:194",
                {
                    p: _I32
                    for p in (
                        "seq_lens_ptr",
                        "decode_seq_lens_ptr",
                        "block_table_ptr",
                        "expanded_block_table_ptr",
                        "decode_lens_ptr",
                    )
                },
                {"BLOCK_SIZE": 1024},
            )
        ],
        "vllm.v1.attention.backends.mla.sparse_swa:ComputeDSparkNoncausalSWAIndicesKernel.kernel": [
            Launch(
                "dspark",
                f"{_SWA}:1368",
                {
                    "swa_indices_ptr": _I32,
                    "swa_lens_ptr": _I32,
                    "query_start_loc_ptr": _I32,
                    "seq_lens_ptr": _I32,
                    "token_to_req_indices_ptr": _I32,
                    "is_valid_token_ptr": "*u1",
                    "block_table_ptr": _I32,
                },
                {"TRITON_BLOCK_SIZE": 1024},
            )
        ],
        "vllm.v1.attention.backends.mla.sparse_swa:ComputePrefillMetadataKernel.kernel": [
            Launch(
                f"prefills<={block}",
                f"{_SWA}:421",
                {
                    "prefill_gather_lens_ptr": _I32,
                    "seq_lens_ptr": _I32,
                    "query_start_loc_ptr": _I32,
                    "replay_start_ptr": _I32,
                },
                # BLOCK_SIZE = next_power_of_2(num_prefills), up to max_num_seqs (128)
                {"BLOCK_SIZE": block},
            )
            for block in (1, 128)
        ],
        "vllm.v1.attention.backends.mla.sparse_swa:_compute_swa_indices_and_lens_kernel": [
            Launch(
                "text",
                f"{_SWA}:1206",
                {
                    "swa_indices_ptr": _I32,
                    "swa_lens_ptr": _I32,
                    "left_visible_ptr": _I32,
                    "right_visible_ptr": _I32,
                    "query_start_loc_ptr": _I32,
                    "seq_lens_ptr": _I32,
                    "token_to_req_indices_ptr": _I32,
                    "is_valid_token_ptr": "*u1",
                    "block_table_ptr": _I32,
                    "replay_start_ptr": _I32,
                },
                {"HAS_IMAGE": False, "TRITON_BLOCK_SIZE": 1024},
            )
        ],
        "vllm.v1.attention.ops.metadata:_token_request_mapping_kernel": [
            Launch(
                "per token",
                "vllm/v1/attention/ops/metadata.py:43",
                {"query_start_loc": _I32, "output": _I32},
            )
        ],
        "vllm.models.deepseek_v41.compressor:_ring_slot_mapping_kernel": [
            Launch(
                "ring of 8",
                "vllm/models/deepseek_v41/compressor.py:133",
                {
                    "slot_mapping_ptr": "*i64",
                    "block_table_ptr": _I32,
                    "token_to_req_ptr": _I32,
                    "positions_ptr": "*i64",
                },
                # capacity = CompressorStateCache.block_size = max(8, pow2(K + 1)) = 8
                {"CAPACITY": 8, "BLOCK": 256},
            )
        ],
        "vllm.models.deepseek_v41.attention:_fill_short_context_topk_indices": [
            Launch(
                f"ratio={ratio}",
                "vllm/models/deepseek_v41/attention.py:1574",
                {"output": _I32, "positions": "*i64"},
                {"TOP_K": 512, "COMPRESS_RATIO": ratio, "PADDED_TOP_K": 512},
                num_warps=8,
            )
            for ratio in ratios
        ],
    }


def _indexer_launches() -> dict[str, list[Launch]]:
    return {
        # Decode rows of unequal length (chunked prefill below the decode threshold) are
        # packed before the logits kernel; V4.1's FP8 index Q is float8_e4m3fn.
        "vllm.v1.attention.ops.common:PackSeqTritonKernel.kernel": [
            # The indexer-pack-seq ledger entry packs the fp8 index Q as bytes.
            Launch(
                "fp8 index q, packed as uint8 by vllm_plugin/pack_seq.py",
                "vllm/model_executor/layers/sparse_attn_indexer.py:834",
                {"x_ptr": "*u8", "out_ptr": "*u8", "lengths_ptr": _I32},
                {"PAD_VALUE": 0, "PAD_IS_UINT8": True, "BLOCK_T": 64, "BLOCK_D": 64},
                num_stages=2,
            )
        ],
        "vllm.v1.attention.ops.common:UnpackSeqTritonKernel.kernel": [
            Launch(
                "topk indices",
                "vllm/model_executor/layers/sparse_attn_indexer.py:949",
                {"packed_ptr": _I32, "out_ptr": _I32, "lengths_ptr": _I32},
                {"BLOCK_T": 64, "BLOCK_D": 64},
                num_stages=2,
            )
        ],
        "vllm.model_executor.layers.sparse_attn_indexer:_upcast_logits_kernel": [
            Launch(
                "bf16 logits",
                "vllm/model_executor/layers/sparse_attn_indexer.py:321",
                {"src_ptr": "*bf16", "dst_ptr": "*fp32", "row_ends_ptr": _I32},
                {"BLOCK": 1024},
                div16=("stride",),
            )
        ],
    }


def _model_launches() -> dict[str, list[Launch]]:
    """Norms, routing, MoE activation, mHC collapse, Engram, compressor, replay."""
    post_wkv = {
        "hidden_states": "*bf16",
        "kv": "*bf16",
        "q_weight": "*bf16",
        "k_weight": "*bf16",
        "token_mask": "*u1",
        "output": "*bf16",
        "eps": "fp32",
        "clamp_value": "fp32",
    }
    hash_ids = {
        "input_ids": _I32,
        "token_map": _I32,
        "dead_mask": "*u1",
        "positions": "*i64",
        "block_table": _I32,
        "query_start_loc": _I32,
        "multipliers": "*i64",
        "primes": "*i64",
        "offsets": "*i64",
        "cache": _I32,
        "lookback_token_ids": _I32,
        "lookback_dead_mask": "*u1",
        "output": _I32,
    }
    unit_hash = {
        name: 1
        for name in (
            "input_stride",
            "mask_stride",
            "position_stride",
            "table_col_stride",
            "query_stride",
            "lookback_col_stride",
            "lookback_mask_col_stride",
        )
    }
    return {
        "vllm.models.common.ops.fused_qk_rmsnorm:FusedQKVRMSNormKernel.kernel": [
            Launch(
                "q 1280 + kv 512",
                "vllm/models/common/ops/fused_qk_rmsnorm.py:167",
                {
                    "q_ptr": "*bf16",
                    "q_out_ptr": "*bf16",
                    "q_weight_ptr": "*bf16",
                    "kv_ptr": "*bf16",
                    "kv_out_ptr": "*bf16",
                    "kv_weight_ptr": "*bf16",
                    "eps": "fp32",
                },
                {"Q_SIZE": 1280, "KV_SIZE": 512, "BLOCK_SIZE": 2048, "launch_pdl": False},
                num_warps=8,
                div16=("q_in_stride", "q_out_stride", "kv_in_stride", "kv_out_stride"),
            )
        ],
        # can_use_dsv4_topk: 256/384 experts, top-6 (the backbone; DSpark's 128 x top-3
        # layers take the generic fused top-k)
        "vllm.model_executor.layers.fused_moe.router.dsv4_topk:_dsv4_topk_kernel": [
            Launch(
                "384 experts",
                "vllm/model_executor/layers/fused_moe/router/dsv4_topk.py:152",
                {
                    "gating_output_ptr": "*fp32",
                    "correction_bias_ptr": "*fp32",
                    "is_padding_ptr": "*u1",
                    "topk_weights_ptr": "*fp32",
                    "topk_ids_ptr": _I32,
                    "routed_scaling_factor": "fp32",
                    "input_ids_ptr": _I32,
                },
                {
                    "bias_vl_ptr": None,
                    "NUM_EXPERTS": 384,
                    "BLOCK_N": 512,
                    "HAS_PADDING": True,
                    "HAS_VL": False,
                    "launch_pdl": False,
                },
                num_warps=1,
                cuda_only_definition=True,
            )
        ],
        "vllm.model_executor.layers.fused_moe.utils:_swiglu_limit_pad_aware_kernel": [
            Launch(
                "swiglu_limit 10",
                "vllm/model_executor/layers/fused_moe/utils.py:671",
                {
                    "input_ptr": "*bf16",
                    "output_ptr": "*bf16",
                    "topk_ids_ptr": _I32,
                    "swiglu_limit": "fp32",
                },
                {
                    "expert_map_ptr": None,
                    "HAS_LIMIT": True,
                    "HAS_EXPERT_MAP": False,
                    "BLOCK_SIZE": 1024,
                },
            )
        ],
        "vllm.model_executor.kernels.mhc.triton:_hc_head_reduce_store_kernel": [
            Launch(
                "hidden 5120, hc 4",
                "vllm/model_executor/kernels/mhc/triton.py:119",
                {"pre_ptr": "*fp32", "x_ptr": "*bf16", "out_ptr": "*bf16"},
                {
                    "hidden_size": 5120,
                    "hc_mult": 4,
                    "pre_stride_t": 4,
                    "pre_stride_m": 1,
                    "x_stride_t": 4 * 5120,
                    "x_stride_m": 5120,
                    "x_stride_h": 1,
                    "out_stride_t": 5120,
                    "out_stride_h": 1,
                    "BLOCK_H": 1024,
                },
            )
        ],
        "vllm.models.deepseek_v41.common.engram:_write_hash_cache_kernel": [
            Launch(
                "slot cache",
                f"{_ENGRAM}:550",
                {
                    "input_ids": _I32,
                    "token_map": _I32,
                    "dead_mask": "*u1",
                    "slot_mapping": "*i64",
                    "cache": _I32,
                },
                {"input_stride": 1, "mask_stride": 1, "slot_stride": 1, "BLOCK_SIZE": 256},
            )
        ],
        "vllm.models.deepseek_v41.common.engram:_hash_ids_kernel": [
            Launch(
                "slot cache",
                f"{_ENGRAM}:563",
                hash_ids,
                {**unit_hash, "MAX_NGRAM": 4, "BLOCK_T": 32, "BLOCK_H": 8},
            ),
            Launch(
                "model runner v2 (no cache)",
                f"{_ENGRAM}:563",
                {k: v for k, v in hash_ids.items() if k != "cache"},
                {**unit_hash, "cache": None, "MAX_NGRAM": 4, "BLOCK_T": 32, "BLOCK_H": 8},
            ),
        ],
        "vllm.models.deepseek_v41.common.engram:_fused_engram_post_wkv_kernel": [
            Launch(
                "hidden 5120, hc 4",
                f"{_ENGRAM}:1785",
                post_wkv,
                {
                    "hidden_stride_d": 1,
                    "kv_stride_d": 1,
                    "q_stride_d": 1,
                    "k_stride_d": 1,
                    "mask_stride": 1,
                    "output_stride_d": 1,
                    "DIM": 5120,
                    "HC_MULT": 4,
                    "BLOCK_SIZE": 8192,
                    "HAS_MASK": True,
                },
                num_warps=8,
                div16=(
                    "hidden_stride_t",
                    "hidden_stride_h",
                    "kv_stride_t",
                    "q_stride_h",
                    "k_stride_h",
                    "output_stride_t",
                    "output_stride_h",
                ),
            )
        ],
        "vllm.models.deepseek_v41.common.engram:_engram_select_rows_kernel": [
            Launch(
                "12 of 24 heads",
                f"{_ENGRAM}:1384",
                {"gathered": "*bf16", "output": "*bf16"},
                {"LOCAL_WIDTH": 12 * 256, "WIDTH": 24 * 256, "BLOCK_SIZE": 1024},
            )
        ],
        f"{_FCQC_MODULE}:_fused_save_compress_norm_kernel": [
            Launch(
                f"ratio={ratio}",
                f"{_FCQC}:108",
                {
                    "raw": "*fp32",
                    "positions": "*i64",
                    "state": "*fp32",
                    "state_slots": "*i64",
                    "query_start_loc": _I32,
                    "req_ids": _I32,
                    "norm_weight": "*bf16",
                    "latent": "*bf16",
                    "prev_rows": "*fp32",
                    "prev_row_indices": "*i64",
                },
                {
                    "RAW_STRIDE": 512 * ratio,
                    "PREV_ROW_STRIDE": 1,
                    "STATE_STRIDE": state[0],
                    "STATE_ROW_STRIDE": state[1],
                    "STATE_BLOCK": state[2],
                    "COMPRESS_RATIO": ratio,
                    "EPS": 1e-20,
                    "JOIN_ROW_PTRS": True,
                    "HAS_PREV_ROWS": False,
                    **(
                        {"state": None, "query_start_loc": None, "req_ids": None}
                        if ratio == 1
                        else {}
                    ),
                },
            )
            # ratio 2 keeps an fp32 ring of 8 rows of 1024; ratio 1 has no state
            for ratio, state in ((1, (1, 1, 1)), (2, (8 * 1024, 1024, 8)))
        ],
        f"{_FCQC_MODULE}:_save_ring_rows_kernel": [
            Launch(
                "ring of 8",
                f"{_FCQC}:251",
                {"rows": "*fp32", "slot_mapping": "*i64", "state": "*fp32"},
                {
                    "ROW_STRIDE": 1024,
                    "STATE_STRIDE": 8 * 1024,
                    "STATE_ROW_STRIDE": 1024,
                    "STATE_BLOCK": 8,
                },
            )
        ],
        "vllm.models.deepseek_v41.nvidia.model_state:_gather_lookback_kernel": [
            Launch(
                "depth 3",
                f"{_MODEL_STATE}:303",
                {
                    "lookback_ptr": _I32,
                    "idx_mapping_ptr": _I32,
                    "query_start_loc_ptr": _I32,
                    "positions_ptr": "*i64",
                    "all_token_ids_ptr": _I32,
                },
                {"DEPTH": 3, "BLOCK_DEPTH": 4},
            )
        ],
        "vllm.models.deepseek_v41.nvidia.model_state:_gather_replay_batch_kernel": [
            Launch(
                "replay",
                f"{_MODEL_STATE}:689",
                {
                    p: _I32
                    for p in (
                        "query_start_loc_ptr",
                        "dropped_before_ptr",
                        "seq_lens_ptr",
                        "replay_start_ptr",
                        "rows_ptr",
                        "kept_query_start_loc_ptr",
                        "kept_kv_start_ptr",
                    )
                }
                | {
                    "positions_ptr": "*i64",
                    "slot_mappings_ptr": "*i64",
                    "kept_positions_ptr": "*i64",
                    "kept_slot_mappings_ptr": "*i64",
                },
                # NUM_GROUPS = KV cache groups with slot mappings (est: 4; a loop bound)
                {"NUM_GROUPS": 4, "BLOCK": 1024},
            )
        ],
        "vllm.models.deepseek_v41.nvidia.model_state:_pad_replayed_slots_kernel": [
            Launch(
                "replay",
                f"{_MODEL_STATE}:386",
                {
                    "slot_mappings_ptr": "*i64",
                    "cacheable_groups_ptr": _I32,
                    "query_start_loc_ptr": _I32,
                    "positions_ptr": "*i64",
                    "replay_start_ptr": _I32,
                },
                {"NUM_GROUPS": 4, "BLOCK": 1024},
            )
        ],
    }


VLLM_LAUNCHES: dict[str, list[Launch]] = {
    **_candidate_launches(),
    **_mla_metadata_launches(),
    **_indexer_launches(),
    **_model_launches(),
}


# A kernel parameter as the walk reads it: (name, is_constexpr, default source or None).
ParamInfo = tuple[str, bool, "str | None"]


def table_problems(kernel_id: str, params: list[ParamInfo]) -> list[str]:
    """What is wrong with the table's entry for a kernel: unknown names, constexprs with
    no value (and no literal default), pointers left to the ``i32`` default."""
    problems = []
    names = {p[0] for p in params}
    for launch in VLLM_LAUNCHES.get(kernel_id, []):
        where = f"{kernel_id} [{launch.variant}]"
        unknown = (set(launch.types) | set(launch.constexprs) | set(launch.div16)) - names
        if unknown:
            problems.append(f"{where}: the kernel has no arguments {sorted(unknown)}")
        for name, is_constexpr, default in params:
            if is_constexpr and name not in launch.constexprs and _literal(default) is _NONE:
                problems.append(f"{where}: constexpr {name} has no value")
            if (
                not is_constexpr
                and name.endswith("ptr")
                and name not in launch.types
                and name not in launch.constexprs
            ):
                problems.append(f"{where}: pointer {name} has no type")
    return problems


_NONE = object()


def _literal(source: str | None) -> object:
    """A parameter default's value when it is a literal, else ``_NONE``."""
    if source is None:
        return _NONE
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return _NONE


def kernel_specs(kernel_id: str, params: list[ParamInfo]) -> list[KernelSpec]:
    """The KernelSpecs to compile for a kernel: one per launch in the table."""
    specs = []
    for launch in VLLM_LAUNCHES[kernel_id]:
        signature = {
            name: launch.types.get(name, "i32")
            for name, is_constexpr, _ in params
            if not is_constexpr and name not in launch.constexprs
        }
        constexprs = {
            name: launch.constexprs[name] if name in launch.constexprs else _literal(default)
            for name, is_constexpr, default in params
            if name in launch.constexprs or is_constexpr
        }
        kernel = kernel_id
        module_name, _, qualname = kernel_id.partition(":")
        if launch.cuda_only_definition:
            kernel = f"{_VLLM_ON_SM80}:{module_name.replace('.', '__')}.{qualname}"
        kernel += ".fn" * launch.unwrap
        specs.append(
            KernelSpec(
                label=f"{module_name.rsplit('.', 1)[-1]}:{qualname}[{launch.variant}]",
                kernel=kernel,
                signature=signature,
                constexprs=constexprs,  # type: ignore[arg-type]
                num_warps=launch.num_warps,
                num_stages=launch.num_stages,
                ints_divisible_by_16=launch.div16,
            )
        )
    return specs


# ---------------------------------------------------------------------------------------
# vLLM's TileLang kernels on the path: the specializations DeepSeek-V4.1 compiles on SM8x


@dataclass(frozen=True)
class TileLangLaunch:
    """One specialization of a ``tilelang.jit`` kernel that V4.1 compiles on SM8x.

    ``params`` are the kernel's keyword (compile-time) parameters as vLLM passes them.
    ``tensors`` are stand-ins for its leading tensor arguments, ``(dtype, shape)``, for a
    kernel whose TileLang signature binds them (vLLM's compile-only warmup passes such
    stand-ins too); empty for a kernel that declares its tensors in its body.
    """

    variant: str
    call_site: str
    params: dict[str, int | float | bool | str]
    tensors: tuple[tuple[str, tuple[int, ...]], ...] = ()


# DeepSeek-V4.1-Flash (shared/docs/vllm-0.33-deepseek-v41.md, "mHC" and "Backbone" rows)
_HIDDEN = 5120
_HC = 4
_MIX = _HC * (_HC + 2)  # 24 mix rows
_HC_STREAM = _HC * _HIDDEN  # the projection input of every sublayer but the first
_TL_PRE = "vllm/model_executor/kernels/mhc/tilelang.py"
_V41_WARMUP = "vllm/models/deepseek_v41/nvidia/model.py:423"
_EPILOGUE_CONSTANTS = {
    "hidden_size": _HIDDEN,
    "hc_mult": _HC,
    "rms_eps": 1e-20,  # config.rms_norm_eps
    "hc_pre_eps": 1e-6,  # config.hc_eps
    "hc_sinkhorn_eps": 1e-6,  # config.hc_eps
    "hc_post_mult_value": 2.0,  # hard-coded in the decoder layer
    "sinkhorn_repeat": 20,  # config.hc_sinkhorn_iters
    "save_pre_mix": True,
}

# The prenorm GEMM at the token-count buckets HcPrenormGemmTileLangKernel.dispatch picks
# with vLLM's defaults and n_splits 1 (no DeepGEMM on SM8x): below 128 tokens a 1024-thread
# block over 4 mix rows, 128..1023 tokens 512 threads over 12 rows, from 1024 tokens the
# two-tokens-per-program kernel. mhc_pre_delayed_tilelang calls it with hidden_size =
# the projection width and hc_mult 1: 5120 for the first layer (the broadcast embedding),
# 20480 for an Engram layer (the full hc stream).
_GEMM_BUCKETS = {  # tokens the stand-in tensors carry -> (n_thr, tile_n)
    1: (1024, 4),
    128: (512, 12),
}


def _prenorm_gemm_tensors(tokens: int, width: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return (
        ("bfloat16", (tokens, width)),  # x
        ("float32", (_MIX, width)),  # fn
        ("float32", (1, tokens, _MIX)),  # out (n_splits 1)
        ("float32", (1, tokens)),  # sqrsum
    )


def _tilelang_launches() -> dict[str, list[TileLangLaunch]]:
    gemm = f"{_TL_PRE}:162"
    widths = {"first layer": _HIDDEN, "engram layer": _HC_STREAM}
    prenorm = [
        TileLangLaunch(
            f"{where}, {'<128' if tokens == 1 else '128..1023'} tokens",
            gemm,
            {
                "hidden_size": width,
                "hc_mult": 1,
                "n_out": _MIX,
                "n_thr": n_thr,
                "tile_n": tile_n,
                "n_splits": 1,
            },
            _prenorm_gemm_tensors(tokens, width),
        )
        for where, width in widths.items()
        for tokens, (n_thr, tile_n) in _GEMM_BUCKETS.items()
    ]
    prenorm_block_m = [
        TileLangLaunch(
            f"{where}, >=1024 tokens",
            gemm,
            {
                "hidden_size": width,
                "hc_mult": 1,
                "n_out": _MIX,
                "n_thr": 512,
                "tile_n": 12,
                "block_m": 2,
            },
            _prenorm_gemm_tensors(1024, width),
        )
        for where, width in widths.items()
    ]
    # The epilogue with the fused RMSNorm: every V4.1 call of mhc_pre_delayed_tilelang
    # passes norm_weight, so it runs MHC_PRE_NORM_KERNEL. What the decoder layer's JIT
    # warmup compiles at startup (enable_jit_warmup is on by default): the broadcast
    # embedding (rms_numel 5120, no pre-mix in), the hc stream without and with the
    # carried pre-mix, and with the aux output DSpark reads (speculative decoding is on
    # in our topologies); each hc-stream variant at n_splits 1 (no DeepGEMM) and 8 (what
    # the fused post + pre-norm GEMM picks, mhc_fused_post_pre_splits). The runtime keys
    # of mhc_pre_delayed_tilelang (n_splits 1) are among them.
    norm_keys = [("broadcast embedding", _HIDDEN, False, False, 1)]
    for splits in (1, 8):
        norm_keys += [
            (f"hc stream, splits {splits}", _HC_STREAM, False, False, splits),
            (f"hc stream + pre-mix, splits {splits}", _HC_STREAM, True, False, splits),
            (f"hc stream + pre-mix + aux, splits {splits}", _HC_STREAM, True, True, splits),
        ]
    with_norm = [
        TileLangLaunch(
            variant,
            _V41_WARMUP if splits != 1 or aux else f"{_TL_PRE}:173",
            {
                **_EPILOGUE_CONSTANTS,
                "norm_eps": 1e-20,  # attn_norm/ffn_norm variance_epsilon = rms_norm_eps
                "n_splits": splits,
                "use_pre_mix_in": pre_mix,
                "rms_numel": numel,
                "split_mode": "fused",
                "write_aux": aux,
            },
        )
        for variant, numel, pre_mix, aux, splits in norm_keys
    ]
    # Without the norm: reached by mhc_pre_delayed_tilelang when norm_weight is None,
    # which no V4.1 call does; compiled at what that call would pass.
    without_norm = [
        TileLangLaunch(
            variant,
            f"{_TL_PRE}:199",
            {
                **_EPILOGUE_CONSTANTS,
                "n_splits": 1,
                "use_pre_mix_in": pre_mix,
                "rms_numel": numel,
                "write_aux": False,
            },
        )
        for variant, numel, pre_mix in (
            ("broadcast embedding", _HIDDEN, False),
            ("hc stream + pre-mix", _HC_STREAM, True),
        )
    ]
    module = "vllm.model_executor.kernels.mhc.tilelang_kernels"
    return {
        f"{module}:hc_prenorm_gemm_tilelang": prenorm,
        f"{module}:hc_prenorm_gemm_block_m_tilelang": prenorm_block_m,
        f"{module}:mhc_pre_big_fuse_with_norm_tilelang": with_norm,
        f"{module}:mhc_pre_big_fuse_tilelang": without_norm,
    }


VLLM_TILELANG_LAUNCHES: dict[str, list[TileLangLaunch]] = _tilelang_launches()

# A TileLang kernel parameter as the walk reads it: (name, annotation source, default).
TileLangParam = tuple[str, "str | None", "str | None"]


def tilelang_table_problems(kernel_id: str, params: list[TileLangParam]) -> list[str]:
    """What is wrong with the table's entry for a TileLang kernel: names the kernel does
    not have, annotated (compile-time) parameters with no value and no default, tensor
    stand-ins that do not match the kernel's leading tensor parameters."""
    problems = []
    names = {p[0] for p in params}
    tensor_params = [name for name, annotation, _ in params if annotation is None]
    for launch in VLLM_TILELANG_LAUNCHES.get(kernel_id, []):
        where = f"{kernel_id} [{launch.variant}]"
        unknown = set(launch.params) - names
        if unknown:
            problems.append(f"{where}: the kernel has no parameters {sorted(unknown)}")
        for name, annotation, default in params:
            if annotation is not None and default is None and name not in launch.params:
                problems.append(f"{where}: parameter {name} has no value")
        if launch.tensors and len(launch.tensors) != len(tensor_params):
            problems.append(
                f"{where}: {len(launch.tensors)} tensor stand-ins for the tensor parameters "
                f"{tensor_params}"
            )
    return problems


_GEMM_KERNELS = ("hc_prenorm_gemm_tilelang", "hc_prenorm_gemm_block_m_tilelang")


def tilelang_dispatch_problems() -> list[str]:
    """Where the table and vLLM's own selection disagree: every compile key vLLM's
    dispatch picks for V4.1 on SM8x must be a launch in the table. Imports vLLM."""
    from dataclasses import asdict

    from vllm.model_executor.kernels.mhc import tilelang_kernels
    from vllm.model_executor.kernels.mhc.tilelang_kernels import (
        _HC_PRENORM_GEMM_TILELANG_KERNEL,
        mhc_fused_post_pre_splits,
    )
    from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

    module = "vllm.model_executor.kernels.mhc.tilelang_kernels"
    tabled = {
        (kid.partition(":")[2], tuple(sorted(launch.params.items())))
        for kid, launches in VLLM_TILELANG_LAUNCHES.items()
        for launch in launches
    }
    wanted: list[tuple[str, dict]] = []
    for width in (_HIDDEN, _HC_STREAM):
        for tokens in (1, 127, 128, 1023, 1024, 8192):
            key = _HC_PRENORM_GEMM_TILELANG_KERNEL.dispatch(
                num_tokens=tokens, hc_hidden_size=width, hidden_size=width, hc_mult=1, n_out=_MIX
            )
            picked = _HC_PRENORM_GEMM_TILELANG_KERNEL.kernel(key)
            kernel = next(n for n in _GEMM_KERNELS if getattr(tilelang_kernels, n) is picked)
            fields = {
                "hidden_size": key.hidden_size,
                "hc_mult": key.hc_mult,
                "n_out": key.n_out,
                "n_thr": key.n_thr,
                "tile_n": key.tile_n,
            }
            fields["block_m" if key.use_block_m else "n_splits"] = (
                key.block_m if key.use_block_m else key.n_splits
            )
            wanted.append((kernel, fields))
    hc_stream_splits = mhc_fused_post_pre_splits(_HIDDEN, _HC)
    warmup_variants = [
        {"rms_numel": _HIDDEN, "use_pre_mix_in": False, "extra_splits": ()},
        {"rms_numel": _HC_STREAM, "use_pre_mix_in": False, "extra_splits": hc_stream_splits},
        {"rms_numel": _HC_STREAM, "use_pre_mix_in": True, "extra_splits": hc_stream_splits},
        {
            "rms_numel": _HC_STREAM,
            "use_pre_mix_in": True,
            "write_aux": True,
            "extra_splits": hc_stream_splits,
        },
    ]
    for variant in warmup_variants:
        keys = MHC_PRE_NORM_KERNEL.get_warmup_keys(
            max_tokens=8192,
            split_mode="fused",
            norm_eps=1e-20,
            **{k: v for k, v in _EPILOGUE_CONSTANTS.items() if k != "save_pre_mix"},
            **variant,
        )
        wanted += [("mhc_pre_big_fuse_with_norm_tilelang", asdict(key)) for key in keys]
    return [
        f"{module}:{kernel} {fields}: vLLM compiles it for V4.1 on SM8x; the table has no "
        "such launch"
        for kernel, fields in wanted
        if (kernel, tuple(sorted(fields.items()))) not in tabled
    ]
