"""The Ampere attention layer for DeepSeek-V4.1: vLLM's FlashMLA layer on our sparse MLA.

On SM80/SM86 vLLM 0.33.0 builds every DeepSeek-V4.1 attention layer as
``DeepseekV4FlashMLAAttention``, whose decode calls FlashMLA ``flash_mla_with_kvcache`` and
whose prefill calls ``flash_mla_sparse_fwd``: FlashMLA has sm_90a/sm_100 code only.

``DeepseekV4AmpereSparseMLAAttention`` subclasses that layer rather than its abstract base,
so everything that is not a FlashMLA launch stays vLLM's own: weights, Q/KV preparation,
the warmup-run workspace reservation and the decode/prefill split in ``forward_mqa``, PCP,
``_o_proj``, the padded head count and the KV-cache geometry. Only the two methods that
launch FlashMLA are replaced:

- decode: ``sparse_mla_decode`` reads the 584-byte records of the SWA cache and of the
  compressed cache (Top-K slots from ``compute_global_topk_indices_and_lens``), as
  FlashMLA's sparse fp8 decode does, for the ``n_local_heads`` real heads only;
- prefill: the same chunked gather (``dequantize_and_gather_k_cache``) and index
  combination (``combine_topk_swa_indices``) into the same workspace shapes as vLLM (so
  the warmup reservation still covers it), then ``sparse_mla_prefill`` on the real heads.

The index and gather ops are called from ``deepinfer_sm80.ops`` directly: they are the
functions the ledger binds in vLLM's modules on SM8x, and vLLM's own gather cannot run
below sm_89.

Padded heads (``padded_heads`` = 64 > ``n_local_heads`` when TP > 1): their q rows are
zero and their output rows are left unwritten (whatever ``torch.empty`` gave). Nothing
reads them in vLLM 0.33.0: ``dsv41_o_proj`` takes ``attn_out[:, :n_local_heads]``, and
vLLM's own SM90 prefill (``_prefill_num_heads = n_local_heads``) leaves them unwritten too.

FlashMLA's tile-scheduler metadata is not needed: the layer declares its own SWA backend
whose metadata builder returns no ``FlashMLASchedMeta`` (no ``get_mla_metadata`` call, no
planner, nothing allocated), and its own sparse-MLA backend, identical to
``FLASHMLA_SPARSE_DSV41`` except that its compute-capability check accepts 8.x. Both are
subclasses declared on the layer, so no vLLM class is modified.

YOCO reuse (``yoco.py``, switch ``DEEPINFER_YOCO``, default on): within one forward pass
the decode Top-K slots, the prefill chunk plan and the prefill combined index rows are
built by the first layer of their sharing group and reused by the rest, where vLLM builds
them in every layer. The gathered compressed history is not reused (yoco.py says why).

``select_dsv4_attn_cls`` replaces ``vllm.models.deepseek_v41.nvidia.model._select_dsv4_attn_cls``
(ledger entry "attention"): vLLM decides as before, and on SM8x its FlashMLA answer becomes
this layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from vllm.models.deepseek_v41.nvidia import model as _v41_model
from vllm.models.deepseek_v41.nvidia.flashmla import (
    DeepseekSparseSWAFlashMLABackend,
    DeepseekSparseSWAFlashMLAMetadataBuilder,
    DeepseekV4FlashMLAAttention,
)
from vllm.models.deepseek_v41.sparse_mla import (
    DeepseekV4FlashMLABackend,
    DeepseekV4FlashMLAMetadata,
)
from vllm.utils.math_utils import round_up
from vllm.v1.attention.backends.mla import sparse_swa as _sparse_swa
from vllm.v1.worker.workspace import current_workspace_manager

from deepinfer_sm80 import envs
from deepinfer_sm80.ops.kv_cache import dequantize_and_gather_k_cache
from deepinfer_sm80.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill
from deepinfer_sm80.ops.topk_swa import (
    combine_topk_swa_indices,
    compute_global_topk_indices_and_lens,
)
from deepinfer_sm80.vllm_plugin import yoco

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.models.deepseek_v41.attention import DeepseekV4Attention
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

# Every key DeepseekSparseSWAMetadataBuilder.build() reads from build_tile_scheduler().
TILE_SCHEDULER_LAYER_TYPES = (
    _sparse_swa._LAYER_TYPE_SWAONLY,
    _sparse_swa._LAYER_TYPE_C4A,
    _sparse_swa._LAYER_TYPE_C128A,
    _sparse_swa._LAYER_TYPE_C1A,
    _sparse_swa._LAYER_TYPE_C2A,
)


class DeepseekV4AmpereSparseMLABackend(DeepseekV4FlashMLABackend):
    """``FLASHMLA_SPARSE_DSV41`` (same name, KV layout, block sizes and metadata builder)
    with a compute-capability check that also accepts SM8x, where our kernels run."""

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return capability.major == 8 or super().supports_compute_capability(capability)


class AmpereSparseSWAMetadataBuilder(DeepseekSparseSWAFlashMLAMetadataBuilder):
    """vLLM's SWA metadata without FlashMLA's tile-scheduler plans: every ``tile_sched_*``
    field stays None, as it does on ROCm/XPU/SM120. Our decode kernel needs no plan (its
    split count follows each token's own rows)."""

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict[str, None]:
        return dict.fromkeys(TILE_SCHEDULER_LAYER_TYPES)


class AmpereSparseSWABackend(DeepseekSparseSWAFlashMLABackend):
    """The FlashMLA SWA backend with the plan-free metadata builder."""

    @staticmethod
    def get_builder_cls() -> type[AmpereSparseSWAMetadataBuilder]:
        return AmpereSparseSWAMetadataBuilder


class DeepseekV4AmpereSparseMLAAttention(DeepseekV4FlashMLAAttention):
    """DeepSeek-V4.1 sparse MLA on SM80/SM86: FlashMLA's layer with our Triton kernels."""

    backend_cls = DeepseekV4AmpereSparseMLABackend
    swa_backend_cls = AmpereSparseSWABackend

    def _get_prefill_num_heads(self) -> int:
        # Our prefill has no 64-head minimum: only the real heads get work.
        return self.n_local_heads

    def _forward_decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor | None,
        swa_metadata: DeepseekSparseSWAMetadata,
        attn_metadata: DeepseekV4FlashMLAMetadata | None,
        swa_only: bool,
        output: torch.Tensor,
    ) -> None:
        """One query token per row: its SWA slots plus (compressed layers) its Top-K
        compressed slots, straight from the fp8 records, into ``output[:, :n_local_heads]``."""
        topk_slots = topk_lens = None
        if not swa_only:
            assert attn_metadata is not None and kv_cache is not None
            topk_slots, topk_lens = self._decode_topk_slots(swa_metadata, attn_metadata)
        sparse_mla_decode(
            q,
            self.swa_cache_layer.kv_cache,
            swa_metadata.decode_swa_indices,
            swa_metadata.decode_swa_lens,
            self.scale,
            self.attn_sink,
            None if swa_only else kv_cache,
            topk_slots,
            topk_lens,
            out=output,
            num_heads=self.n_local_heads,
        )

    def _forward_prefill(
        self,
        q: torch.Tensor,
        positions: torch.Tensor,
        compressed_k_cache: torch.Tensor | None,
        swa_k_cache: torch.Tensor,
        output: torch.Tensor,
        attn_metadata: DeepseekV4FlashMLAMetadata | None,
        swa_metadata: DeepseekSparseSWAMetadata,
    ) -> None:
        """Prefill tokens (rows of ``q`` from 0) in chunks of at most
        ``PREFILL_CHUNK_SIZE`` requests: per request the workspace holds its compressed
        history in rows ``[0, N)`` and its SWA tail from row N; each token's combined
        index row selects from them."""
        swa_only = self.compress_ratio == 0
        num_decodes = swa_metadata.num_decodes
        seq_lens = swa_metadata.prefill_seq_lens
        gather_lens = swa_metadata.prefill_gather_lens
        starts_cpu = swa_metadata.query_start_loc_cpu
        starts = swa_metadata.query_start_loc
        assert seq_lens is not None and gather_lens is not None
        assert starts_cpu is not None and starts is not None
        assert self.topk_indices_buffer is not None
        first = swa_metadata.num_decode_tokens
        topk_rows = self.topk_indices_buffer[first : first + swa_metadata.num_prefill_tokens]
        top_k = 0 if swa_only else topk_rows.shape[-1]
        # Same widths as vLLM's prefill and its warmup reservation (forward_mqa), so the
        # locked workspace always fits.
        index_width = round_up(top_k + self.window_size, 128)
        heads = self.n_local_heads
        head_dim = q.shape[-1]
        base = int(starts_cpu[num_decodes])
        plan = self._prefill_chunk_plan(swa_metadata)
        for chunk_no, (req_start, req_end, n_compressed, row_stride) in enumerate(plan):
            reqs = slice(req_start, req_end)
            kv, index_buf, length_buf = current_workspace_manager().get_simultaneous(
                ((req_end - req_start, row_stride, head_dim), torch.bfloat16),
                ((self.max_num_batched_tokens, index_width), torch.int32),
                ((self.max_num_batched_tokens,), torch.int32),
            )
            if not swa_only:
                assert attn_metadata is not None and compressed_k_cache is not None
                dequantize_and_gather_k_cache(
                    kv,
                    compressed_k_cache,
                    seq_lens[reqs] // self.compress_ratio,
                    None,
                    attn_metadata.block_table[num_decodes:][reqs],
                    attn_metadata.block_size // self.compress_ratio,
                    0,
                )
            dequantize_and_gather_k_cache(
                kv,
                swa_k_cache,
                seq_lens[reqs],
                gather_lens[reqs],
                swa_metadata.block_table[num_decodes:][reqs],
                swa_metadata.block_size,
                n_compressed,
            )
            tok_start = int(starts_cpu[num_decodes + req_start]) - base
            tok_end = int(starts_cpu[num_decodes + req_end]) - base
            n_tok = tok_end - tok_start
            indices, lengths = self._prefill_indices(
                swa_metadata,
                chunk_no,
                plan[chunk_no],
                topk_rows[tok_start:tok_end],
                top_k,
                workspace=(index_buf[:n_tok], length_buf[:n_tok]),
            )
            sparse_mla_prefill(
                q[tok_start:tok_end, :heads],
                kv.view(-1, head_dim),
                indices,
                self.scale,
                self.attn_sink[:heads],
                lengths,
                out=output[tok_start:tok_end, :heads],
            )

    # ------------------------------------------------------------ YOCO reuse (yoco.py)
    # Each helper builds what vLLM's layer builds in every layer; within one forward
    # pass the memo hands a later layer of the same sharing group the first layer's
    # result (keys and invalidation rules: yoco.py). DEEPINFER_YOCO=0, or no forward
    # context, builds in every layer as before.

    def _decode_topk_slots(
        self,
        swa_metadata: DeepseekSparseSWAMetadata,
        attn_metadata: DeepseekV4FlashMLAMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The index source wrote local compressed positions; the kernel wants slots."""
        assert self.topk_indices_buffer is not None
        assert swa_metadata.token_to_req_indices is not None
        assert swa_metadata.is_valid_token is not None
        num_tokens = swa_metadata.num_decode_tokens
        num_decodes = swa_metadata.num_decodes
        page = attn_metadata.block_size // self.compress_ratio

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            return compute_global_topk_indices_and_lens(
                self.topk_indices_buffer[:num_tokens],
                swa_metadata.token_to_req_indices,
                attn_metadata.block_table[:num_decodes],
                page,
                swa_metadata.is_valid_token[:num_tokens],
            )

        role = yoco.LayerRole.of(self)
        if not yoco.MEMO.active(role):
            return build()
        assert role is not None
        return yoco.MEMO.get(
            yoco.DECODE_TOPK,
            yoco.DECODE_TOPK,
            key=(
                role.index_source,
                getattr(self, "compressed_cache_prefix", None),
                self.compress_ratio,
                page,
                num_tokens,
                num_decodes,
            ),
            anchors=(
                swa_metadata,
                attn_metadata,
                self.topk_indices_buffer,
                swa_metadata.token_to_req_indices,
                swa_metadata.is_valid_token,
                attn_metadata.block_table,
            ),
            role=role,
            build=build,
            reads_topk=True,
        )

    def _prefill_chunk_plan(
        self, swa_metadata: DeepseekSparseSWAMetadata
    ) -> Sequence[tuple[int, int, int, int]]:
        """vLLM's chunk plan (a CPU loop over the prefill requests); equal for every
        layer of one compress ratio in a pass."""
        has_compressed = self.compress_ratio != 0

        def build() -> tuple[tuple[int, int, int, int], ...]:
            return tuple(
                swa_metadata.get_prefill_chunk_plan(
                    compress_ratio=self.compress_ratio,
                    prefill_chunk_size=self.PREFILL_CHUNK_SIZE,
                    has_compressed=has_compressed,
                )
            )

        role = yoco.LayerRole.of(self)
        if not yoco.MEMO.active(role):
            return build()
        assert role is not None
        return yoco.MEMO.get(
            yoco.PREFILL_PLAN,
            yoco.PREFILL_PLAN,
            key=(self.compress_ratio, self.PREFILL_CHUNK_SIZE, has_compressed),
            anchors=(swa_metadata,),
            role=role,
            build=build,
            reads_topk=False,
        )

    def _prefill_indices(
        self,
        swa_metadata: DeepseekSparseSWAMetadata,
        chunk_no: int,
        chunk: tuple[int, int, int, int],
        topk_rows: torch.Tensor,
        top_k: int,
        workspace: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk's combined (Top-K + SWA) index rows into its workspace rows.

        Without reuse they go to the workspace, as in vLLM. With reuse they go to
        tensors of their own (the workspace is handed to other ops between layers):
        at most ``max_num_batched_tokens x round_up(top_k + window, 128)`` int32 per
        step (20 MiB at 8192 tokens), held until the next group or pass replaces them.
        """
        req_start, req_end, n_compressed, row_stride = chunk
        num_decodes = swa_metadata.num_decodes
        starts = swa_metadata.query_start_loc
        seq_lens = swa_metadata.prefill_seq_lens
        gather_lens = swa_metadata.prefill_gather_lens
        assert starts is not None and seq_lens is not None and gather_lens is not None

        def build(
            out: tuple[torch.Tensor, torch.Tensor] | None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return combine_topk_swa_indices(
                topk_rows,
                starts[num_decodes + req_start : num_decodes + req_end + 1],
                seq_lens[req_start:req_end],
                gather_lens[req_start:req_end],
                self.window_size,
                self.compress_ratio,
                top_k,
                row_stride,
                n_compressed,
                out=out,
            )

        role = yoco.LayerRole.of(self)
        if not yoco.MEMO.active(role):
            return build(workspace)
        assert role is not None
        return yoco.MEMO.get(
            yoco.PREFILL_INDICES,
            (yoco.PREFILL_INDICES, chunk_no),
            key=(
                role.index_source,
                self.compress_ratio,
                self.window_size,
                top_k,
                chunk,
                swa_metadata.num_decode_tokens,
                swa_metadata.num_prefill_tokens,
                topk_rows.storage_offset(),
                topk_rows.shape[0],
            ),
            anchors=(
                swa_metadata,
                self.topk_indices_buffer,
                starts,
                seq_lens,
                gather_lens,
            ),
            role=role,
            build=lambda: build(None),
            reads_topk=self.compress_ratio != 0,
        )


# vLLM's selector, kept before the ledger rebinds the name in its module.
_vllm_select_dsv4_attn_cls = _v41_model._select_dsv4_attn_cls


def _on_sm8x() -> bool:
    """SM8x, or forced: DEEPINFER_FORCE=1 exercises the Ampere layer on other GPUs (an
    H200 stands in for Ampere in our GPU tests)."""
    if envs.flag("DEEPINFER_FORCE"):
        return True
    capability = _v41_model.current_platform.get_device_capability()
    return capability is not None and capability.major == 8


def select_dsv4_attn_cls(vllm_config: VllmConfig) -> type[DeepseekV4Attention]:
    """vLLM's choice, except that its FlashMLA layer becomes ours on SM8x. Explicit
    choices of other backends (FlashInfer, mega attention) are left as vLLM answers them."""
    chosen = _vllm_select_dsv4_attn_cls(vllm_config)
    if chosen is DeepseekV4FlashMLAAttention and _on_sm8x():
        return DeepseekV4AmpereSparseMLAAttention
    return chosen


__all__ = [
    "AmpereSparseSWABackend",
    "AmpereSparseSWAMetadataBuilder",
    "DeepseekV4AmpereSparseMLAAttention",
    "DeepseekV4AmpereSparseMLABackend",
    "select_dsv4_attn_cls",
]
