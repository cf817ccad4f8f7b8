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
    level: str = "function"  # rebinding a Python function with vLLM's signature
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
