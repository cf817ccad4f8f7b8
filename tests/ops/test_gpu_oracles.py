"""GPU oracles: vLLM 0.33.0's own kernels against ours, on the same inputs in vLLM's layouts.

**The ``gpu``-marked tests in this file pass on an NVIDIA H100**
(``benchmarks/results/NVIDIA_H100.gpu_tier_oracles.log``; figures in
``NVIDIA_H100.gpu_oracles_summary.txt``). What can be checked without a GPU is checked by the
other tests here (``vllm`` tier, CPU):

- each input builder produces exactly the layouts, dtypes, shapes and strides of vLLM's
  call site (page strides from vLLM's own KV-cache specs, index rows as its metadata
  builders allocate them, workspaces as its indexer sizes them);
- vLLM's own wrapper code (FlashMLA's interface file, ``vllm.utils.deep_gemm``, its
  TileLang mHC entry points) accepts those inputs and reaches the compiled op with
  arguments that bind to the op's schema (read from the shared library vLLM ships) and
  meet the requirements the op states (restated here as checks);
- rehearsals: the GPU tests' own bodies run on CPU with vLLM's launches replaced by
  stand-ins that go through that wrapper code and return what a correct kernel returns
  (the references, correctly rounded), and ours under the Triton interpreter (mHC: the
  references stand in for both sides; the cache writers and the gather: vLLM's Triton
  kernels themselves under the interpreter). The comparisons pass ours and reject every
  standard mutant (``tools/mutants.py``). Not rehearsed: the 129-token decode (the same
  code at a larger batch) and the CUDA SWA writer, whose call is bound to its schema.

Without a GPU, the one step left unverified is the launch of vLLM's kernels (and, for mHC, of
ours).

On a Hopper GPU (the project's test GPU is an H200, sm_90) vLLM's kernels for
DeepSeek-V4.1 run natively, so they are an oracle that nobody here wrote:

===================  ============================================  =========================
ours                 vLLM's (as its sm_90 path calls them)          compared
===================  ============================================  =========================
sparse_mla_decode    FlashMLA ``flash_mla_with_kvcache`` (sparse    per-element budget
                     fp8 decode: SWA cache + compressed cache)      (tools/compare.py)
sparse_mla_prefill   FlashMLA ``flash_mla_sparse_fwd``              per-element budget
fp8_fp4_mqa_logits   DeepGEMM ``fp8_fp4_mqa_logits``                exact-logit budget
fp8_fp4_paged_...    DeepGEMM ``fp8_fp4_paged_mqa_logits``          exact-logit budget
mhc_fused_post_...   TileLang ``mhc_fused_post_pre_delayed_...``    budget; fp32 bound
mhc_post             TileLang ``mhc_post_tilelang``                 per-element budget
rope_quant_insert    Triton ``rope_quant_insert`` (compressed KV)   bytes equal
indexer_k_norm_...   Triton ``indexer_k_norm_rope_store``           bytes equal
quantize_and_...     Triton ``quantize_and_insert_k_cache``         bytes equal
dequantize_and_...   ``dequantize_and_gather_k_cache`` (CuteDSL     bits equal
                     where ``cutlass`` imports) and its Triton one
rope_quant_insert    CUDA ``fused_deepseek_v4_kv_rope_insert``      NoPE and scale bytes
(ratio 1)            (the SWA writer; our decode reads its          equal, RoPE within one
                     records)                                       bf16 ulp
===================  ============================================  =========================

The interpreter oracles (vLLM's Triton kernels on CPU) are ``test_vllm_oracles.py`` and
the ``vllm``-marked tests of ``test_cache_writers.py``, ``test_indexer_logits.py`` and
``test_mhc.py``; nothing here repeats them.

On the GPU: ``make test-oracles PYTHON=python3`` (``make test-gpu`` runs them too wherever
vLLM imports). Comparisons a GPU cannot make (FlashMLA or DeepGEMM below sm_90, vLLM's fp8
Triton kernels below sm_89) skip as not applicable; vLLM's TileLang mHC and its CUDA SWA
writer run on Ampere too.

Budgets:

- bf16 outputs (attention, mHC streams): the oracle's output must itself meet the
  project's budget against the fp64 reference, and ours must meet that budget centred on
  the oracle's output: ``assert_within_torch_budget(ours, theirs, torch_bf16 - ref +
  theirs)``, the comparison the project makes between two of its own kernels.
- indexer logits: DeepGEMM accumulates fp8 products in Hopper's reduced-precision
  tensor-core accumulator, so it is allowed ``2**-8`` of each head's ``sum |q_d k_d|``
  (the allowance ``test_indexer_logits.py`` gives vLLM's per-head-bf16 torch reference)
  on top of the fp32 budget; ours against DeepGEMM gets both allowances.
- mHC fp32 coefficients: each within ``FP32_ATOL`` of the reference value of its own
  formulation (vLLM's fused kernel, up to 32 tokens, feeds the unrounded residual to the
  projection; ours the bf16 one), so ours within twice that of vLLM's plus the gap
  between the two formulations' reference values.
- cache writers and the gather: bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import json
import math
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from deepinfer_sm80 import envs
from deepinfer_sm80.ops.cache_writers import indexer_k_norm_rope_store, rope_quant_insert
from deepinfer_sm80.ops.indexer_logits import (
    fp8_fp4_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    get_paged_mqa_logits_metadata,
)
from deepinfer_sm80.ops.indexer_logits.layout import page_views as index_page_views
from deepinfer_sm80.ops.indexer_logits.ref import mqa_logits_ref, paged_mqa_logits_ref, row_lengths
from deepinfer_sm80.ops.kv_cache import dequantize_and_gather_k_cache, quantize_and_insert_k_cache
from deepinfer_sm80.ops.kv_cache.layout import RECORD_BYTES, page_bytes
from deepinfer_sm80.ops.kv_cache.ref import insert_ref, page_views
from deepinfer_sm80.ops.mhc import mhc_fused_post_pre_delayed, mhc_post
from deepinfer_sm80.ops.mhc.geometry import HC_MULT, HIDDEN
from deepinfer_sm80.ops.mhc.inputs import NORM_EPS, model_like_inputs
from deepinfer_sm80.ops.mhc.ref import fused_post_pre_delayed_ref, post_fixed_order, post_ref
from deepinfer_sm80.ops.sparse_mla import engine as mla_engine
from deepinfer_sm80.ops.sparse_mla import sparse_mla_prefill
from deepinfer_sm80.ops.sparse_mla.ref import (
    decode_rows,
    sparse_mla_decode_ref,
    sparse_mla_prefill_ref,
)
from tools import mutants, tiers
from tools.compare import assert_within_torch_budget
from tools.poison import cache_bytes, move_cache, nan_empty, paged_cache

from .test_cache_writers import (
    _assert_same_bytes,
    _index_cache,
    _latents,
    _norm_weight,
    _random_k_pre,
    _rope_table,
    _slots_positions,
    cpu_only,
    gpu_casts,
)
from .test_indexer_logits import fp32_budget, make_paged, make_prefill
from .test_kv_cache import gather_case
from .test_sparse_mla import (
    BUDGET_REJECTS,
    PREFILL_MUTANTS,
    SCALE,
    TOPK,
    WINDOW,
    DecodeCase,
    _decode_mutant,
    _prefill_mutant,
    _queries,
    _realistic_k,
)

pytestmark = pytest.mark.vllm

vllm = tiers.import_or_skip("vllm")
VLLM_DIR = Path(vllm.__file__).parent
_V41_OPS = "vllm.models.deepseek_v41.common.ops"

# vLLM's DeepSeek-V4.1 geometry on sm_90 (vllm/models/deepseek_v41/...):
PADDED_HEADS = 64  # DeepseekV4FlashMLAAttention.get_padded_num_q_heads(<= 64)
SWA_BLOCK = 32  # DeepseekV4SWACache(block_size=32), attention.py
KERNEL_BLOCK_SM90 = 64  # DeepseekV4FlashMLABackend.get_supported_kernel_block_sizes on sm_90
PREFILL_WIDTH = 640  # round_up(index_topk + window, 128): the combined index row
TP_HEADS = [64, 32, 16, 8]  # heads per rank at TP 1, 2, 4, 8
FP32_ATOL = 1.9e-3  # mHC fp32 outputs against the exact value (test_mhc.py)
DEEPGEMM_HEAD_DOT = 2.0**-8  # DeepGEMM's allowance per head, of sum_d |q_d k_d|

# The GPU tests' cases, shared with the CPU checks of their inputs.
DECODE_T = 7
DECODE_SWA_LENS = [128, 1, 77, 128, 33, 100, 127]
DECODE_EXTRA_LENS = [512, 0, 301, 511, 1, 257, 63]
PREFILL_LENS = [640, 513, 129, 1, 77, 255, 600, 3, 401]


# ====================================================================== shared helpers


def vllm_own(module: str, name: str):
    """vLLM's function ``module.name`` itself: a plugin patch bound over it (our
    replacement, the ledger's work) would make the oracle compare ours with ours."""
    fn = getattr(importlib.import_module(module), name)
    owner = getattr(fn, "__module__", None) or type(fn).__module__
    assert not owner.startswith("deepinfer_sm80"), (
        f"{module}.{name} is bound to {owner}.{getattr(fn, '__name__', fn)}: a DeepInfer "
        "patch is active in this process, so it is not vLLM's kernel"
    )
    return fn


@functools.cache
def compiled_op_schema(library: Path, op: str) -> torch._C.FunctionSchema:
    """The schema ``op`` is registered with, read from the shared library's strings (the
    library itself needs a CUDA driver to load)."""
    found = re.search(
        rb"\x00(" + re.escape(op.encode()) + rb"\([^\x00]*)\x00", library.read_bytes()
    )
    assert found, f"{library.name}: no schema for {op}"
    return torch._C.parse_schema(found.group(1).decode())


_SCHEMA_TYPES = {"Tensor": torch.Tensor, "int": int, "float": (float, int), "bool": bool}


def bind_to_schema(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict | None = None):
    """``{name: value}`` as the dispatcher would bind ``args``/``kwargs`` to ``schema``;
    fails on a missing, surplus or wrongly typed argument."""
    kwargs = dict(kwargs or {})
    params = schema.arguments
    assert len(args) <= len(params), f"{schema.name}: {len(args)} positional arguments"
    bound = {}
    for i, p in enumerate(params):
        if i < len(args):
            value = args[i]
        elif p.name in kwargs:
            value = kwargs.pop(p.name)
        else:
            assert p.has_default_value(), f"{schema.name}: {p.name} is missing"
            value = p.default_value
        kind = str(p.type)
        optional = kind.startswith("Optional[")
        base = kind[len("Optional[") : -1] if optional else kind
        if value is None:
            assert optional, f"{schema.name}: {p.name} ({kind}) is None"
        else:
            assert isinstance(value, _SCHEMA_TYPES[base]) and not (
                base in ("int", "float") and isinstance(value, bool)
            ), f"{schema.name}: {p.name} must be {kind}, got {type(value).__name__}"
        bound[p.name] = value
    assert not kwargs, f"{schema.name}: unknown arguments {sorted(kwargs)}"
    return bound


class ReachedLaunchError(Exception):
    """Raised by the CPU stand-ins of vLLM's kernels: vLLM's wrapper got that far."""

    def __init__(self, name: str, args: tuple, kwargs: dict):
        super().__init__(name)
        self.name, self.args_, self.kwargs = name, args, kwargs


def launch_stand_in(name: str):
    def launch(*args, **kwargs):
        raise ReachedLaunchError(name, args, kwargs)

    return launch


def require_capability(what: str, ok) -> tuple[int, int]:
    """(major, minor) of the GPU; a not-applicable skip where ``ok(major, minor)`` is
    false (a hardware limit no package changes)."""
    cap = torch.cuda.get_device_capability()
    if not ok(*cap):
        tiers.skip_not_applicable(f"{what}; this GPU is sm_{cap[0]}{cap[1]}")
    return cap


ORACLE_RECORD_ENV = "DEEPINFER_ORACLE_RECORD"  # a JSON-lines file each comparison appends to


def record(case: str, figures: dict) -> None:
    """Print a comparison's figures (``-s`` shows them) and, where DEEPINFER_ORACLE_RECORD
    names a file, append them to it as one JSON line with the GPU's name: the published
    oracle figures come from that file."""
    print(f"{case}: {figures}")
    path = envs.get(ORACLE_RECORD_ENV)
    if path:
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        with open(path, "a") as f:
            f.write(json.dumps({"case": case, "gpu": gpu, **figures}) + "\n")


def errors_vs(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Max absolute and relative L2 error of ``out`` against ``ref``, in fp64."""
    err = out.double() - ref.double()
    scale = float(ref.double().norm())
    return {
        "max_abs": float(err.abs().max()) if err.numel() else 0.0,
        "rel_norm": float(err.norm()) / scale if scale else float(err.norm()),
    }


def error_ratio(ours: float, theirs: float) -> float:
    """ours / theirs, where an exact oracle (0) makes any error of ours infinitely worse."""
    return ours / theirs if theirs else (0.0 if ours == 0 else math.inf)


def assert_matches_oracle(name, ours, theirs, ref, torch_bf16, *, max_error_ratio=None) -> dict:
    """The oracle's output within the project's budget against the fp64 reference (it
    and our reference agree), then ours within that budget centred on the oracle's
    output (the per-element and norm bounds of tools/compare.py). With
    ``max_error_ratio``, ours' relative L2 error against the fp64 reference may be at
    most that multiple of the oracle's. Returns the figures: both outputs' errors
    against the fp64 reference, their ratios, and the centred check's figures."""
    assert_within_torch_budget(f"{name}: the oracle vs the fp64 reference", theirs, ref, torch_bf16)
    centred = assert_within_torch_budget(
        f"{name}: ours vs the oracle", ours, theirs, torch_bf16 - ref + theirs
    )
    ours_err, theirs_err = errors_vs(ours, ref), errors_vs(theirs, ref)
    figures = {
        "ours_vs_fp64": ours_err,
        "oracle_vs_fp64": theirs_err,
        "rel_norm_ratio": error_ratio(ours_err["rel_norm"], theirs_err["rel_norm"]),
        "max_abs_ratio": error_ratio(ours_err["max_abs"], theirs_err["max_abs"]),
        "ours_vs_oracle": centred,
    }
    if max_error_ratio is not None:
        assert figures["rel_norm_ratio"] <= max_error_ratio, (
            f"{name}: ours' relative L2 error against the fp64 reference, "
            f"{ours_err['rel_norm']:.4g}, is {figures['rel_norm_ratio']:.3g}x the oracle's "
            f"{theirs_err['rel_norm']:.4g} (at most {max_error_ratio}x)"
        )
    return figures


# ====================================================================== FlashMLA


FLASHMLA_SO = VLLM_DIR / "_flashmla_C.abi3.so"
# Ours' relative L2 error against the fp64 reference, at most this multiple of FlashMLA's.
FLASHMLA_ERROR_RATIO = 1.5
FLASHMLA_INTERFACE = VLLM_DIR / "third_party" / "flashmla" / "flash_mla_interface.py"


def _v4_cache_ok(name: str, kv: torch.Tensor) -> None:
    assert kv.dtype == torch.uint8 and kv.dim() == 4, f"{name}: {kv.dtype} {tuple(kv.shape)}"
    assert kv.shape[2] == 1 and kv.shape[3] == RECORD_BYTES, f"{name}: {tuple(kv.shape)}"
    assert kv.stride(1) == RECORD_BYTES and kv.stride(3) == 1, f"{name}: strides {kv.stride()}"
    assert kv.stride(0) % 576 == 0, f"{name}: page stride {kv.stride(0)} is not 576-aligned"


def check_flashmla_sparse_decode(a: dict) -> None:
    """What FlashMLA's sparse decode requires of its arguments (its interface's
    docstring and the checks of ``sparse_decode_fwd``): 512-dim bf16 q with 64 or 128
    heads, 584-byte V4 records in pages of whole rows (576-aligned page stride), int32
    index rows whose widths are multiples of its 64-entry Top-K block, one length per
    query, a sink per head, and an output of q's shape."""
    q = a["q"]
    assert q.dtype == torch.bfloat16 and q.dim() == 4 and q.shape[3] == 512, tuple(q.shape)
    assert q.stride(3) == 1
    b, s_q, h_q, _ = q.shape
    assert h_q in (64, 128), f"h_q={h_q}: FlashMLA's fp8 decode takes 64 or 128 heads"
    assert a["d_v"] == 512
    for cache, idx, length in (
        ("kv", "indices", "topk_length"),
        ("extra_kv", "extra_indices", "extra_topk_length"),
    ):
        if a[cache] is None:
            assert a[idx] is None and a[length] is None, f"{idx}/{length} without {cache}"
            continue
        _v4_cache_ok(cache, a[cache])
        i = a[idx]
        assert i is not None and i.dtype == torch.int32 and i.dim() == 3, idx
        assert tuple(i.shape[:2]) == (b, s_q) and i.stride(2) == 1, f"{idx}: {tuple(i.shape)}"
        assert i.shape[2] % 64 == 0, f"{idx}: width {i.shape[2]} is not a multiple of 64"
        if a[length] is not None:
            n = a[length]
            assert n.dtype == torch.int32 and tuple(n.shape) == (b,) and n.is_contiguous()
    sink = a["attn_sink"]
    if sink is not None:
        assert sink.dtype == torch.float32 and tuple(sink.shape) == (h_q,) and sink.is_contiguous()
    out = a["out_"]
    if out is not None:
        assert out.dtype == torch.bfloat16 and tuple(out.shape) == (b, s_q, h_q, 512)
        assert out.is_contiguous()


def check_flashmla_sparse_prefill(a: dict) -> None:
    """FlashMLA's sparse prefill: bf16 q ``[s_q, h_q, 512]`` with 8, 16, 32, 64 or 128
    heads on sm_90 (8/16/32 may be strided head slices of a wider buffer), bf16 rows
    ``[s_kv, 1, 512]``, int32 indices ``[s_q, 1, topk]`` with topk a multiple of 128 (why
    vLLM rounds the combined row to 128), a sink per head, lengths per query, out like q."""
    q, kv, idx = a["q"], a["kv"], a["indices"]
    assert q.dtype == torch.bfloat16 and q.dim() == 3 and q.shape[2] == 512 and q.stride(2) == 1
    s_q, h_q, _ = q.shape
    assert h_q in (8, 16, 32, 64, 128), f"h_q={h_q}"
    if h_q in (64, 128):
        assert q.is_contiguous(), "64 or 128 heads: q must be contiguous"
    assert kv.dtype == torch.bfloat16 and kv.dim() == 3 and kv.shape[1:] == (1, 512)
    assert kv.stride(2) == 1
    assert idx.dtype == torch.int32 and idx.dim() == 3 and tuple(idx.shape[:2]) == (s_q, 1)
    assert idx.stride(2) == 1 and idx.shape[2] % 128 == 0, tuple(idx.shape)
    assert a["d_v"] == 512
    sink, lens, out = a["attn_sink"], a["topk_length"], a["out_"]
    if sink is not None:
        assert sink.dtype == torch.float32 and tuple(sink.shape) == (h_q,) and sink.is_contiguous()
    if lens is not None:
        assert lens.dtype == torch.int32 and tuple(lens.shape) == (s_q,) and lens.is_contiguous()
    if out is not None:
        assert out.dtype == torch.bfloat16 and tuple(out.shape) == (s_q, h_q, 512)
        assert out.stride(2) == 1 and (h_q in (8, 16, 32) or out.is_contiguous())


class FlashMLAOnCPU:
    """Stands in for ``torch.ops._flashmla_C`` on a CPU: each call is bound to the op's
    schema from ``_flashmla_C.abi3.so``, checked against what the op requires, recorded,
    and answered with outputs of the op's shapes: NaN (or ``out_`` as given), or with
    ``compute`` the fp64 reference of what the op computes, rounded to bf16 (a correctly
    rounding kernel)."""

    def __init__(self, compute: bool = False):
        self.calls: list[tuple[str, dict]] = []
        self.compute = compute

    def sparse_decode_fwd(self, *args, **kwargs):
        a = bind_to_schema(compiled_op_schema(FLASHMLA_SO, "sparse_decode_fwd"), args, kwargs)
        check_flashmla_sparse_decode(a)
        self.calls.append(("sparse_decode_fwd", a))
        b, s_q, h_q, _ = a["q"].shape
        out = a["out_"] if a["out_"] is not None else torch.full((b, s_q, h_q, 512), float("nan"))
        if self.compute:
            cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
            extra = a["extra_kv"]
            ref, _ = sparse_mla_decode_ref(
                a["q"][:, 0].cpu(),
                move_cache(a["kv"].squeeze(2), "cpu"),
                a["indices"][:, 0].cpu(),
                cpu(a["topk_length"]),
                a["sm_scale"],
                cpu(a["attn_sink"]),
                None if extra is None else move_cache(extra.squeeze(2), "cpu"),
                None if extra is None else a["extra_indices"][:, 0].cpu(),
                cpu(a["extra_topk_length"]),
            )
            out[:, 0] = ref.to(torch.bfloat16).to(out.device)
        lse = torch.full((b, h_q, s_q), float("nan"))
        meta = torch.zeros(1, 8, dtype=torch.int32)
        return out, lse, meta, torch.zeros(b + 1, dtype=torch.int32)

    def sparse_prefill_fwd(self, *args, **kwargs):
        a = bind_to_schema(compiled_op_schema(FLASHMLA_SO, "sparse_prefill_fwd"), args, kwargs)
        check_flashmla_sparse_prefill(a)
        self.calls.append(("sparse_prefill_fwd", a))
        s_q, h_q, _ = a["q"].shape
        out = a["out_"] if a["out_"] is not None else torch.full((s_q, h_q, 512), float("nan"))
        if self.compute:
            sink, lens = a["attn_sink"], a["topk_length"]
            ref, _ = sparse_mla_prefill_ref(
                a["q"].cpu(),
                a["kv"][:, 0].cpu(),
                a["indices"][:, 0].cpu(),
                a["sm_scale"],
                None if sink is None else sink.cpu(),
                None if lens is None else lens.cpu(),
            )
            out.copy_(ref.to(torch.bfloat16))
        stats = torch.full((s_q, h_q), float("nan"))
        return [out, stats, stats.clone()]


def flashmla_interface_on_cpu(fake: FlashMLAOnCPU) -> types.ModuleType:
    """vLLM's FlashMLA interface module (the code ``vllm.v1.attention.ops.flashmla``
    re-exports on a GPU), loaded from its file with ``fake`` as the compiled op
    namespace; ``vllm._flashmla_C`` is stubbed only while the file imports it."""
    name = "vllm._flashmla_C"
    saved = sys.modules.get(name)
    sys.modules[name] = types.ModuleType(name)
    try:
        spec = importlib.util.spec_from_file_location("_flashmla_interface_cpu", FLASHMLA_INTERFACE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop(name)
        else:
            sys.modules[name] = saved
    module.flash_mla_cuda = fake
    return module


def flashmla_on_gpu():
    """vLLM's FlashMLA wrappers on a GPU that runs them (sm_90 / sm_100)."""
    require_capability(
        "FlashMLA's sparse kernels have sm_90a and sm_100 code only",
        lambda major, _: major in (9, 10),
    )
    ops = importlib.import_module("vllm.v1.attention.ops.flashmla")
    ok, reason = ops.is_flashmla_sparse_supported()
    if not ok:
        pytest.fail(f"vLLM's FlashMLA sparse kernels are unavailable on this GPU: {reason}")
    assert ops.flash_mla_with_kvcache.__module__ == "vllm.third_party.flashmla.flash_mla_interface"
    return ops


# ---------------------------------------------------------------------- decode inputs


def _records(rows: torch.Tensor, block_size: int, g: torch.Generator, device):
    """A paged cache as vLLM allocates it (``torch.zeros``, pages 576-aligned) holding
    ``rows`` at shuffled slots, written by the PyTorch encoder (the bytes of vLLM's
    writer and of ours: test_kv_cache, test_cache_writers); returns (cache ``[blocks,
    block_size, 584]``, slots)."""
    n = rows.shape[0]
    num_blocks = -(-n // block_size) + 2
    cache = paged_cache(num_blocks, block_size, fill=0)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    insert_ref(rows, cache, slots, block_size)
    return move_cache(cache, device), slots


def _holes_past(idx: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """-1 past each token's length, as vLLM's index builders leave the rows."""
    idx = idx.clone()
    idx[torch.arange(idx.shape[1])[None, :] >= lens[:, None]] = -1
    return idx


def vllm_sink(heads: int, values: torch.Tensor) -> torch.Tensor:
    """The layer's ``attn_sink``: vLLM's ``make_attention_sink(64)`` (-inf on the padding
    heads) with the rank's real heads loaded."""
    from vllm.model_executor.model_loader.weight_utils import make_attention_sink

    sink = make_attention_sink(PADDED_HEADS, torch.float32).detach().clone()
    sink[:heads] = values[:heads].float()
    return sink


def oracle_decode_case(
    T, heads, ratio, *, seed, device, swa_lens=None, extra_lens=None, holes=0.05
) -> DecodeCase:
    """A decode batch in vLLM's sm_90 layouts: q ``[T, 64, 512]`` with the real heads
    first and zero padding heads; the layer's SWA cache (32-token pages) and, for ratio
    1 or 2, the compressed cache (64 // ratio states per page, the sm_90 kernel block);
    SWA index rows of 128 global slots and Top-K rows of 512, -1 holes inside the counted
    length and -1 past it; the sink with -inf padding."""
    g = torch.Generator().manual_seed(seed)
    swa_rows = _realistic_k(3 * WINDOW, g)
    swa_cache, swa_slots = _records(swa_rows, SWA_BLOCK, g, device)
    idx = swa_slots[torch.randint(0, swa_rows.shape[0], (T, WINDOW), generator=g)].int()
    idx[torch.rand(T, WINDOW, generator=g) < holes] = -1
    lens = torch.tensor(swa_lens or [WINDOW] * T, dtype=torch.int32)
    case = DecodeCase(
        q=None,
        cache=swa_cache,
        idx=_holes_past(idx, lens).to(device),
        lens=lens.to(device),
        sink=None,
    )
    rows = [swa_rows]
    if ratio:
        comp_rows = _realistic_k(2 * TOPK, g)
        comp_cache, comp_slots = _records(comp_rows, KERNEL_BLOCK_SM90 // ratio, g, device)
        eidx = comp_slots[torch.randint(0, comp_rows.shape[0], (T, TOPK), generator=g)].int()
        eidx[torch.rand(T, TOPK, generator=g) < holes] = -1
        elens = torch.tensor(extra_lens or [TOPK] * T, dtype=torch.int32)
        case.extra, case.extra_lens = comp_cache, elens.to(device)
        case.extra_idx = _holes_past(eidx, elens).to(device)
        rows.append(comp_rows)
    q = torch.zeros(T, PADDED_HEADS, 512, dtype=torch.bfloat16)
    q[:, :heads] = _queries(T, heads, torch.cat(rows), g)
    case.q = q.to(device)
    case.sink = vllm_sink(heads, torch.randn(heads, generator=g) * 2 + 4).to(device)
    return case


def flashmla_decode_kwargs(case: DecodeCase, sched, out: torch.Tensor) -> dict:
    """What ``DeepseekV4FlashMLAAttention._forward_decode`` (vllm/models/deepseek_v41/
    nvidia/flashmla.py) passes to ``flash_mla_with_kvcache`` for this batch: q
    unsqueezed to one query per sequence, both caches as ``[blocks, bs, 1, 584]``
    (``kv_cache.unsqueeze(-2)``), ``decode_swa_indices`` ``[T, 1, 128]`` and the global
    Top-K slots viewed ``[T, 1, 512]``."""
    T = case.q.shape[0]
    extra = case.extra is not None
    return dict(
        q=case.q.unsqueeze(1),
        k_cache=case.cache.unsqueeze(-2),
        block_table=None,
        head_dim_v=512,
        tile_scheduler_metadata=sched,
        cache_seqlens=None,
        is_fp8_kvcache=True,
        indices=case.idx.view(T, 1, -1),
        topk_length=case.lens,
        softmax_scale=SCALE,
        attn_sink=case.sink,
        extra_k_cache=case.extra.unsqueeze(-2) if extra else None,
        extra_indices_in_kvcache=case.extra_idx.view(T, 1, -1) if extra else None,
        extra_topk_length=case.extra_lens if extra else None,
        out=out.unsqueeze(1),
    )


def run_ours_decode(case: DecodeCase, heads: int, device) -> torch.Tensor:
    """Our decode as the plugin's attention layer calls it (``num_heads`` = the rank's
    real heads) into a NaN-poisoned ``[T, 64, 512]``."""
    out = nan_empty(*case.q.shape, device=device)
    got, _ = case.run(heads, out=out)
    assert got.data_ptr() == out.data_ptr()
    return out


def decode_refs(case: DecodeCase, heads: int) -> dict:
    return {p: case.ref(heads, p)[0][:, :heads] for p in ("fp64", "bf16")}


def check_decode(case: DecodeCase, heads: int, ours, theirs, refs=None) -> dict:
    refs = refs or decode_refs(case, heads)
    return assert_matches_oracle(
        "sparse MLA decode",
        ours[:, :heads].float().cpu(),
        theirs[:, :heads].float().cpu(),
        refs["fp64"],
        refs["bf16"],
        max_error_ratio=FLASHMLA_ERROR_RATIO,
    )


def _leaning_queries(rows: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Queries ``[n, 512]`` each leaning on its row of ``rows`` (temperatures 0.6-1.5)."""
    temp = torch.linspace(0.6, 1.5, rows.shape[0])[:, None]
    return (torch.randn(rows.shape, generator=g) * 1.4 + temp * rows.float() * 2).bfloat16()


MUTANT_TILE = slice(mutants.TILE_ROWS, 2 * mutants.TILE_ROWS)  # the entries drop-tile removes


def mutant_decode_case(device) -> DecodeCase:
    """One token of 128 SWA + 512 Top-K rows, 16 real heads (TP4). Head h leans on the
    row of SWA entry 16 + h, so the rows the mutants touch (the dropped tile, head 0's
    heaviest row) carry weight; sinks the softmax feels (from ~2 % to ~90 % of the weight
    across the heads, as test_sparse_mla's mutant case)."""
    heads = 16
    case = oracle_decode_case(1, heads, 1, seed=16, device=device)
    g = torch.Generator().manual_seed(17)
    row = case.idx[0].cpu()
    outside = row[(row >= 0) & (torch.arange(WINDOW) >= MUTANT_TILE.stop)]
    tile = row[MUTANT_TILE]
    tile[tile < 0] = outside[: int((tile < 0).sum())]
    case.idx[0, MUTANT_TILE] = tile.to(device)
    lean = decode_rows(move_cache(case.cache, "cpu"), tile.long())
    case.q[0, :heads] = _leaning_queries(lean, g).to(device)
    _, lse = case.ref(heads, "fp64")
    felt = lse[0, :heads] + torch.linspace(-4, 2, heads, dtype=torch.float64)
    case.sink = vllm_sink(heads, felt).to(device)
    return case


def decode_mutant_output(case: DecodeCase, mutant: str, heads: int, ours, device):
    kernel_case, mutate = _decode_mutant(case, mutant)
    out = ours if kernel_case is None else run_ours_decode(kernel_case, heads, device)
    if mutate is not None:
        out = out.clone()
        out[:, :heads] = mutate(out[:, :heads])
    return out


# ---------------------------------------------------------------------- prefill inputs


@dataclasses.dataclass
class PrefillCase:
    q: torch.Tensor  # [T, 64, 512], the layer's padded q buffer
    kv: torch.Tensor  # [S, 512], the bf16 gather workspace [chunk, M, 512] flattened
    idx: torch.Tensor  # [T, 640] int32 combined rows
    lens: torch.Tensor  # [T] int32
    sink: torch.Tensor  # [64] f32
    heads: int

    def run(self, out: torch.Tensor) -> torch.Tensor:
        """Ours as the plugin's layer calls it: the rank's heads of q, sink and out."""
        h = self.heads
        sparse_mla_prefill(
            self.q[:, :h], self.kv, self.idx, SCALE, self.sink[:h], self.lens, out=out[:, :h]
        )
        return out

    def ref(self, precision: str) -> torch.Tensor:
        h = self.heads
        return sparse_mla_prefill_ref(
            self.q[:, :h].cpu(),
            self.kv.cpu(),
            self.idx.cpu(),
            SCALE,
            self.sink[:h].cpu(),
            self.lens.cpu(),
            precision=precision,
        )[0]


def oracle_prefill_case(
    T, heads, *, seed, device, lens=None, chunk=2, rows_per_req=400, holes=0.05
):
    """A prefill chunk as vLLM's layer hands it to FlashMLA: the bf16 workspace ``[chunk,
    M, 512]`` (viewed ``[S, 1, 512]``), combined index rows of 640 entries with -1 holes
    inside each token's length and -1 past it, q the padded ``[T, 64, 512]`` buffer."""
    g = torch.Generator().manual_seed(seed)
    ws = _realistic_k(chunk * rows_per_req, g).view(chunk, rows_per_req, 512)
    kv = ws.view(-1, 512)
    S = kv.shape[0]
    idx = torch.randint(0, S, (T, PREFILL_WIDTH), generator=g, dtype=torch.int32)
    idx[torch.rand(T, PREFILL_WIDTH, generator=g) < holes] = -1
    lens_t = torch.tensor(lens or [PREFILL_WIDTH] * T, dtype=torch.int32)
    q = torch.zeros(T, PADDED_HEADS, 512, dtype=torch.bfloat16)
    q[:, :heads] = _queries(T, heads, kv, g)
    sink = vllm_sink(heads, torch.randn(heads, generator=g) * 2 + 4)
    return PrefillCase(
        q.to(device),
        kv.to(device),
        _holes_past(idx, lens_t).to(device),
        lens_t.to(device),
        sink.to(device),
        heads,
    )


def flashmla_prefill_kwargs(case: PrefillCase, out: torch.Tensor) -> dict:
    """What ``_forward_prefill`` passes to ``flash_mla_sparse_fwd`` on sm_90: the layer's
    ``_prefill_num_heads`` (the rank's heads when 8, 16 or 32, else the padded 64) of q,
    sink and out, the workspace as ``[S, 1, 512]``, the combined rows unsqueezed."""
    h = case.heads
    return dict(
        q=case.q[:, :h],
        kv=case.kv.view(-1, 1, 512),
        indices=case.idx.unsqueeze(1),
        sm_scale=SCALE,
        attn_sink=case.sink[:h],
        topk_length=case.lens,
        out=out[:, :h],
    )


def check_prefill(case: PrefillCase, ours, theirs, refs=None) -> dict:
    refs = refs or {p: case.ref(p) for p in ("fp64", "bf16")}
    h = case.heads
    return assert_matches_oracle(
        "sparse MLA prefill",
        ours[:, :h].float().cpu(),
        theirs[:, :h].float().cpu(),
        refs["fp64"],
        refs["bf16"],
        max_error_ratio=FLASHMLA_ERROR_RATIO,
    )


def mutant_prefill_case(device) -> PrefillCase:
    """Three tokens, 16 heads (a strided slice of the padded buffer, as on sm_90 at TP4).
    Token 0 counts its whole row of distinct workspace rows and head h leans on the row
    of entry 16 + h, as in the decode case; sinks the softmax feels."""
    case = oracle_prefill_case(3, 16, seed=3, device=device, lens=[640, 333, 129])
    g = torch.Generator().manual_seed(4)
    S = case.kv.shape[0]
    case.idx[0] = torch.randperm(S, generator=g)[:PREFILL_WIDTH].int().to(device)
    lean = case.kv[case.idx[0, MUTANT_TILE].long()].cpu()
    case.q[0, :16] = _leaning_queries(lean, g).to(device)
    _, lse = sparse_mla_prefill_ref(
        case.q[:, :16].cpu(), case.kv.cpu(), case.idx.cpu(), SCALE, None, case.lens.cpu()
    )
    felt = lse.amin(dim=0) + torch.linspace(-4, 2, 16, dtype=torch.float64)
    case.sink = vllm_sink(16, felt).to(device)
    return case


def prefill_mutant_output(case: PrefillCase, mutant: str, ours, device):
    h = case.heads
    q, kv, idx, sink = case.q[:, :h], case.kv, case.idx, case.sink[:h]
    (mq, mkv, midx, msink), mutate = _prefill_mutant(q, kv, idx, sink, mutant)
    if any(a is not b for a, b in zip((mq, mkv, midx, msink), (q, kv, idx, sink), strict=True)):
        out = nan_empty(*case.q.shape, device=device)
        sparse_mla_prefill(mq, mkv, midx, SCALE, msink, case.lens, out=out[:, :h])
    else:
        out = ours.clone()
    if mutate is not None:
        out = out.clone()
        out[:, :h] = mutate(out[:, :h])
    return out


# ---------------------------------------------------------------------- GPU: FlashMLA


@pytest.fixture(params=["tilelang", "triton"])
def mla_kernels(request, monkeypatch):
    """Both of our engines for each comparison (the TileLang kernels ship; Triton is the
    fallback)."""
    monkeypatch.setenv(mla_engine.DECODE_ENGINE_ENV, request.param)
    monkeypatch.setenv(mla_engine.PREFILL_ENGINE_ENV, request.param)
    return request.param


@pytest.mark.gpu
@pytest.mark.parametrize("ratio", [0, 1, 2], ids=["swa-only", "ratio1", "ratio2"])
@pytest.mark.parametrize("heads", TP_HEADS, ids=lambda h: f"H{h}")
def test_sparse_mla_decode_equals_flashmla(device, mla_kernels, heads, ratio):
    fm = flashmla_on_gpu()
    case = oracle_decode_case(
        DECODE_T,
        heads,
        ratio,
        seed=heads + 10 * ratio,
        device=device,
        swa_lens=DECODE_SWA_LENS,
        extra_lens=DECODE_EXTRA_LENS if ratio else None,
    )
    theirs = nan_empty(*case.q.shape, device=device)
    fm.flash_mla_with_kvcache(**flashmla_decode_kwargs(case, fm.get_mla_metadata()[0], theirs))
    ours = run_ours_decode(case, heads, device)
    record(f"decode {mla_kernels} H{heads} ratio {ratio}", check_decode(case, heads, ours, theirs))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 8], ids=lambda h: f"H{h}")
def test_sparse_mla_decode_equals_flashmla_at_batch_129(device, mla_kernels, heads):
    g = torch.Generator().manual_seed(129)
    swa = torch.randint(1, WINDOW + 1, (129,), generator=g).tolist()
    extra = torch.randint(0, TOPK + 1, (129,), generator=g).tolist()
    fm = flashmla_on_gpu()
    case = oracle_decode_case(129, heads, 2, seed=7, device=device, swa_lens=swa, extra_lens=extra)
    theirs = nan_empty(*case.q.shape, device=device)
    fm.flash_mla_with_kvcache(**flashmla_decode_kwargs(case, fm.get_mla_metadata()[0], theirs))
    ours = run_ours_decode(case, heads, device)
    record(f"decode {mla_kernels} T=129 H{heads}", check_decode(case, heads, ours, theirs))


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", mutants.MUTANTS)
def test_sparse_mla_decode_mutants_fail_against_flashmla(device, mla_kernels, mutant):
    fm = flashmla_on_gpu()
    case = mutant_decode_case(device)
    theirs = nan_empty(*case.q.shape, device=device)
    fm.flash_mla_with_kvcache(**flashmla_decode_kwargs(case, fm.get_mla_metadata()[0], theirs))
    ours = run_ours_decode(case, 16, device)
    refs = decode_refs(case, 16)
    check_decode(case, 16, ours, theirs, refs)
    bad = decode_mutant_output(case, mutant, 16, ours, device)
    with pytest.raises(AssertionError, match=BUDGET_REJECTS):
        check_decode(case, 16, bad, theirs, refs)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", TP_HEADS, ids=lambda h: f"H{h}")
def test_sparse_mla_prefill_equals_flashmla(device, mla_kernels, heads):
    fm = flashmla_on_gpu()
    case = oracle_prefill_case(
        len(PREFILL_LENS), heads, seed=heads, device=device, lens=PREFILL_LENS
    )
    theirs = nan_empty(*case.q.shape, device=device)
    fm.flash_mla_sparse_fwd(**flashmla_prefill_kwargs(case, theirs))
    ours = case.run(nan_empty(*case.q.shape, device=device))
    record(f"prefill {mla_kernels} H{heads}", check_prefill(case, ours, theirs))


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", PREFILL_MUTANTS)
def test_sparse_mla_prefill_mutants_fail_against_flashmla(device, mla_kernels, mutant):
    fm = flashmla_on_gpu()
    case = mutant_prefill_case(device)
    theirs = nan_empty(*case.q.shape, device=device)
    fm.flash_mla_sparse_fwd(**flashmla_prefill_kwargs(case, theirs))
    ours = case.run(nan_empty(*case.q.shape, device=device))
    refs = {p: case.ref(p) for p in ("fp64", "bf16")}
    check_prefill(case, ours, theirs, refs)
    bad = prefill_mutant_output(case, mutant, ours, device)
    with pytest.raises(AssertionError, match=BUDGET_REJECTS):
        check_prefill(case, bad, theirs, refs)


# ---------------------------------------------------------------------- CPU: FlashMLA inputs


def test_flashmla_interface_is_the_file_vllm_imports():
    """The file loaded on CPU below is what ``vllm.v1.attention.ops.flashmla`` imports
    its FlashMLA functions from."""
    wrapper = (VLLM_DIR / "v1" / "attention" / "ops" / "flashmla.py").read_text()
    assert "from vllm.third_party.flashmla.flash_mla_interface import" in wrapper
    assert FLASHMLA_INTERFACE.is_file() and FLASHMLA_SO.is_file()


@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_decode_cache_pages_are_vllms(ratio):
    """The caches' page strides are vLLM's page sizes for these layers, from the specs
    the layers declare (``DeepseekV4SWACache.get_kv_cache_spec``: 32 tokens of 584-byte
    records, 576 alignment; the kv source's ``MLAAttentionSpec``: 64-token sm_90 kernel
    blocks of ``tokens_per_state = ratio``)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec, get_kv_quant_mode

    case = oracle_decode_case(1, 8, ratio, seed=1, device="cpu")
    swa = SlidingWindowMLASpec(
        block_size=SWA_BLOCK, num_kv_heads=1, max_tp_shards=1, head_size=512,
        dtype=torch.uint8, sliding_window=WINDOW, cache_dtype_str="fp8_ds_mla",
        state_content_bytes=RECORD_BYTES, alignment=576, model_version="deepseek_v4",
        kv_quant_mode=get_kv_quant_mode("fp8_ds_mla"),
    )  # fmt: skip
    assert case.cache.shape[1:] == (SWA_BLOCK, RECORD_BYTES)
    assert case.cache.stride() == (swa.page_size_bytes, RECORD_BYTES, 1)
    if ratio:
        comp = MLAAttentionSpec(
            block_size=KERNEL_BLOCK_SM90, num_kv_heads=1, head_size=512, dtype=torch.uint8,
            tokens_per_state=ratio, cache_dtype_str="fp8_ds_mla", alignment=576,
            model_version="deepseek_v4", kv_quant_mode=get_kv_quant_mode("fp8_ds_mla"),
            state_content_bytes=RECORD_BYTES,
        )  # fmt: skip
        assert case.extra.shape[1:] == (KERNEL_BLOCK_SM90 // ratio, RECORD_BYTES)
        assert case.extra.stride() == (comp.page_size_bytes, RECORD_BYTES, 1)
    else:
        assert case.extra is None


def test_decode_index_rows_are_vllms():
    """dtypes and shapes of vLLM's decode metadata: ``decode_swa_indices`` ``[T, 1, 128]``
    and ``decode_swa_lens`` ``[T]`` int32 (the SWA builder's buffers), the global Top-K
    slots ``[T, 512]`` int32 viewed ``[T, 1, 512]`` and their lengths ``[T]``; -1 past each
    length; q ``[T, 64, 512]`` bf16 with zero padding heads; the sink -inf past them."""
    case = oracle_decode_case(
        DECODE_T, 8, 2, seed=1, device="cpu", swa_lens=DECODE_SWA_LENS, extra_lens=DECODE_EXTRA_LENS
    )
    kw = flashmla_decode_kwargs(case, object(), torch.empty_like(case.q))
    assert kw["indices"].shape == (DECODE_T, 1, WINDOW) and kw["indices"].is_contiguous()
    assert kw["extra_indices_in_kvcache"].shape == (DECODE_T, 1, TOPK)
    for name in ("indices", "extra_indices_in_kvcache", "topk_length", "extra_topk_length"):
        assert kw[name].dtype == torch.int32, name
    for idx, lens in ((case.idx, case.lens), (case.extra_idx, case.extra_lens)):
        past = torch.arange(idx.shape[1])[None, :] >= lens[:, None]
        assert (idx[past] == -1).all() and (idx[~past] >= -1).all()
        assert (idx[~past] == -1).any()  # holes inside the counted lengths too
    assert kw["q"].shape == (DECODE_T, 1, PADDED_HEADS, 512) and kw["q"].dtype == torch.bfloat16
    assert (case.q[:, 8:] == 0).all() and (case.q[:, :8] != 0).any()
    assert torch.isneginf(case.sink[8:]).all() and torch.isfinite(case.sink[:8]).all()
    assert kw["out"].shape == kw["q"].shape


@pytest.mark.parametrize("ratio", [0, 2])
@pytest.mark.parametrize("heads", [64, 8])
def test_decode_call_reaches_flashmlas_op_as_its_schema_requires(heads, ratio):
    """vLLM's own ``flash_mla_with_kvcache`` (its interface file, run on CPU) takes the
    arguments the GPU test passes, plans with a fresh ``FlashMLASchedMeta`` and calls
    ``sparse_decode_fwd`` with arguments that bind to the compiled op's schema and meet
    its requirements, handing it our very tensors."""
    fake = FlashMLAOnCPU()
    iface = flashmla_interface_on_cpu(fake)
    case = oracle_decode_case(
        DECODE_T, heads, ratio, seed=2, device="cpu", swa_lens=DECODE_SWA_LENS,
        extra_lens=DECODE_EXTRA_LENS if ratio else None,
    )  # fmt: skip
    out = nan_empty(*case.q.shape)
    sched = iface.get_mla_metadata()[0]
    kwargs = flashmla_decode_kwargs(case, sched, out)
    inspect.signature(iface.flash_mla_with_kvcache).bind(**kwargs)
    got, _ = iface.flash_mla_with_kvcache(**kwargs)
    ((op, a),) = fake.calls
    assert op == "sparse_decode_fwd" and sched.have_initialized
    assert a["q"].data_ptr() == case.q.data_ptr() and got.data_ptr() == out.data_ptr()
    assert a["kv"].data_ptr() == case.cache.data_ptr() and a["attn_sink"] is case.sink
    assert (a["extra_kv"] is None) == (ratio == 0)
    assert a["sm_scale"] == SCALE and a["d_v"] == 512 and not a["enable_batch_invariant"]


@pytest.mark.parametrize("heads", TP_HEADS)
def test_prefill_call_reaches_flashmlas_op_as_its_schema_requires(heads):
    """The same for ``flash_mla_sparse_fwd`` with the rank's heads (strided slices of
    the 64-head buffer below 64)."""
    fake = FlashMLAOnCPU()
    iface = flashmla_interface_on_cpu(fake)
    case = oracle_prefill_case(len(PREFILL_LENS), heads, seed=1, device="cpu", lens=PREFILL_LENS)
    out = nan_empty(*case.q.shape)
    kwargs = flashmla_prefill_kwargs(case, out)
    inspect.signature(iface.flash_mla_sparse_fwd).bind(**kwargs)
    got = iface.flash_mla_sparse_fwd(**kwargs)
    ((op, a),) = fake.calls
    assert op == "sparse_prefill_fwd" and got[0].data_ptr() == out.data_ptr()
    assert (
        a["q"].shape == (len(PREFILL_LENS), heads, 512) and a["q"].data_ptr() == case.q.data_ptr()
    )
    assert a["kv"].shape == (case.kv.shape[0], 1, 512) and a["indices"].shape[1:] == (1, 640)
    idx, lens = case.idx, case.lens
    past = torch.arange(idx.shape[1])[None, :] >= lens[:, None].long()
    assert (idx[past] == -1).all() and ((idx >= -1) & (idx < case.kv.shape[0])).all()


def test_error_ratio_check_can_fail(tmp_path, monkeypatch):
    """Ours at 1.2x the oracle's error against the fp64 reference passes the 1.5x check;
    at 2x it fails, naming both errors. Each comparison lands in the record file."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 512, generator=g, dtype=torch.float64)
    noise = torch.randn(64, 512, generator=g, dtype=torch.float64) * 2**-9 * ref.abs()
    torch_bf16 = ref.bfloat16().double()
    theirs, near, far = ref + noise, ref + 1.2 * noise, ref + 2 * noise
    record_file = tmp_path / "oracle.jsonl"
    monkeypatch.setenv(ORACLE_RECORD_ENV, str(record_file))
    figures = assert_matches_oracle("t", near, theirs, ref, torch_bf16, max_error_ratio=1.5)
    assert figures["rel_norm_ratio"] == pytest.approx(1.2)
    record("near", figures)
    with pytest.raises(AssertionError, match=r"is 2x the oracle's .* \(at most 1.5x\)"):
        assert_matches_oracle("t", far, theirs, ref, torch_bf16, max_error_ratio=1.5)
    (line,) = record_file.read_text().splitlines()
    assert json.loads(line)["case"] == "near"
    assert json.loads(line)["rel_norm_ratio"] == pytest.approx(1.2)


def test_flashmla_requirement_checks_can_fail():
    """The requirement checks the stand-in runs refuse what FlashMLA refuses."""
    case = oracle_decode_case(2, 8, 1, seed=3, device="cpu")
    iface = flashmla_interface_on_cpu(FlashMLAOnCPU())
    out = nan_empty(*case.q.shape)
    bad = [
        dict(q=case.q[:, :32].unsqueeze(1)),  # 32 heads: the decode takes 64 or 128
        dict(indices=case.idx[:, :100].reshape(2, 1, 100)),  # width not a multiple of 64
        dict(attn_sink=case.sink[:8]),  # one sink per q head
        dict(extra_topk_length=case.extra_lens.long()),
    ]
    for change in bad:
        kwargs = {**flashmla_decode_kwargs(case, iface.get_mla_metadata()[0], out), **change}
        if "q" in change:
            kwargs["out"] = torch.empty_like(change["q"])
        with pytest.raises(AssertionError):
            iface.flash_mla_with_kvcache(**kwargs)
    p = oracle_prefill_case(2, 16, seed=3, device="cpu", rows_per_req=40)
    kwargs = {**flashmla_prefill_kwargs(p, nan_empty(*p.q.shape)), "indices": p.idx[:, None, :600]}
    with pytest.raises(AssertionError, match="600"):
        iface.flash_mla_sparse_fwd(**kwargs)


# ====================================================================== DeepGEMM indexer


DEEPGEMM_SO = VLLM_DIR / "third_party" / "deep_gemm" / "_C_extension.abi3.so"
INDEX_PAGE_ALIGN = math.lcm(256, 576)  # see index_cache_pad
INDEX_WIDTH = 1024  # max_model_len // ratio of the decode cases
PAGED_LENS = [1, 130, 67, 515, 1000]
PREFILL_REQS = [[(37, 3), (0, 6), (200, 5)], [(600, 9), (5, 4)]]


def index_cache_pad(block_size: int) -> int:
    """Page padding making the index-cache page stride a multiple of 576 (vLLM's page
    alignment for this cache) and of 256 (the block stride vLLM guarantees DeepGEMM when
    its sparse logits are on): ``lcm(256, 576) = 2304`` bytes."""
    raw = block_size * 132
    return -(-raw // INDEX_PAGE_ALIGN) * INDEX_PAGE_ALIGN - raw


def paged_context_lens(lens, next_n: int, device) -> torch.Tensor:
    """vLLM's decode ``seq_lens``: ``[B, 1]`` without native spec decode, ``[B, next_n]``
    (row j sees ``len - next_n + 1 + j``) with it."""
    ctx = torch.tensor(lens, dtype=torch.int32)
    if next_n == 1:
        return ctx[:, None].contiguous().to(device)
    return row_lengths(ctx, len(lens), next_n).view(len(lens), next_n).int().contiguous().to(device)


def check_deepgemm_requirements_mqa(a: dict) -> None:
    """DeepGEMM's ``fp8_fp4_mqa_logits`` on sm_90 with FP8 queries: q ``[M, H, 128]``
    e4m3 with no query scales and 128 % H == 0, keys ``[N, 128]`` e4m3 with ``[N]`` fp32
    scales, fp32 weights ``[M, H]``, int32 ``[M]`` key ranges."""
    q, kv, sf, w = a["q"], a["kv"], a["kv_sf"], a["weights"]
    assert q.dtype == torch.float8_e4m3fn and q.dim() == 3 and q.shape[2] == 128
    assert a["q_sf"] is None and 128 % q.shape[1] == 0 and q.is_contiguous()
    assert kv.dtype == torch.float8_e4m3fn and kv.dim() == 2 and kv.shape[1] == 128
    assert kv.stride(1) == 1 and kv.stride(0) == 128
    assert sf.dtype == torch.float32 and tuple(sf.shape) == (kv.shape[0],) and sf.is_contiguous()
    assert w.dtype == torch.float32 and tuple(w.shape) == tuple(q.shape[:2]) and w.is_contiguous()
    for name in ("cu_seq_len_k_start", "cu_seq_len_k_end"):
        t = a[name]
        assert t.dtype == torch.int32 and tuple(t.shape) == (q.shape[0],) and t.is_contiguous()


def check_deepgemm_requirements_paged(a: dict, num_sms: int) -> None:
    """DeepGEMM's ``fp8_fp4_paged_mqa_logits`` on sm_90 (FP8 cache): q ``[B, next_n, H,
    128]`` e4m3, next_n 1, 2 or 4, 128 % H == 0; the cache ``[blocks, 32|64, 1, 132]``
    uint8 with positions 132 bytes apart; fp32 weights ``[B * next_n, H]``; int32
    ``[B, next_n]`` context lengths; int32 block table with unit column stride; the
    schedule ``[num_sms / multicast + 1, 2]`` int32 (multicast 2 at next_n 4)."""
    q, cache, w, ctx, table = (
        a["q"],
        a["kv_cache"],
        a["weights"],
        a["context_lens"],
        a["block_table"],
    )
    assert q.dtype == torch.float8_e4m3fn and q.dim() == 4 and q.shape[3] == 128
    assert a["q_sf"] is None and a["indices"] is None and q.is_contiguous()
    B, next_n, H, _ = q.shape
    assert next_n in (1, 2, 4) and 128 % H == 0
    assert cache.dtype == torch.uint8 and cache.dim() == 4 and cache.shape[2:] == (1, 132)
    assert cache.shape[1] in (32, 64) and cache.stride(1) == 132 and cache.stride(3) == 1
    assert cache.stride(0) % 4 == 0
    assert w.dtype == torch.float32 and tuple(w.shape) == (B * next_n, H) and w.is_contiguous()
    assert ctx.dtype == torch.int32 and tuple(ctx.shape) == (B, next_n) and ctx.is_contiguous()
    assert table.dtype == torch.int32 and table.dim() == 2 and table.shape[0] == B
    assert table.stride(1) == 1
    meta = a["schedule_meta"]
    slots = num_sms // (2 if next_n == 4 else 1)
    assert meta.dtype == torch.int32 and tuple(meta.shape) == (slots + 1, 2)


class DeepGEMMOnCPU:
    """Stands in for DeepGEMM's ``_C`` facade on a CPU: forwards as the facade does (the
    ``(values, scales)`` pairs unpacked) to a recorder of the torch op, bound to its
    schema from ``_C_extension.abi3.so`` and checked against the op's requirements; the
    logits are NaN, or with ``compute`` the exact ones in fp32."""

    def __init__(self, num_sms: int = 132, compute: bool = False):
        self.calls: list[tuple[str, dict]] = []
        self.num_sms = num_sms
        self.compute = compute

    def _op(self, name: str, args: tuple) -> dict:
        a = bind_to_schema(compiled_op_schema(DEEPGEMM_SO, name), args)
        self.calls.append((name, a))
        return a

    def mqa_logits(self, q, kv, weights, ks, ke, max_seqlen_k, schedule_meta=None):
        a = self._op(
            "fp8_fp4_mqa_logits",
            (q[0], q[1], kv[0], kv[1], weights, ks, ke, max_seqlen_k, schedule_meta),
        )
        check_deepgemm_requirements_mqa(a)
        if self.compute:
            args = (q[0], kv[0], kv[1], weights, ks, ke)
            return mqa_logits_ref(*(t.cpu() for t in args), max_seqlen_k).float().to(ks.device)
        return torch.full((q[0].shape[0], max_seqlen_k), float("nan"))

    def paged_mqa_logits(self, q, kv_cache, weights, ctx, table, meta, max_len, indices=None):
        a = self._op(
            "fp8_fp4_paged_mqa_logits",
            (q[0], q[1], kv_cache, weights, ctx, table, meta, max_len, indices),
        )
        check_deepgemm_requirements_paged(a, self.num_sms)
        if self.compute:
            args = (q[0], kv_cache.squeeze(2), weights, ctx, table)
            cpu = [t.cpu() if i != 1 else move_cache(t, "cpu") for i, t in enumerate(args)]
            return paged_mqa_logits_ref(*cpu, max_len).float().to(ctx.device)
        return torch.full((q[0].shape[0] * q[0].shape[1], max_len), float("nan"))

    def paged_metadata(self, ctx, block_kv, num_sms, indices=None):
        a = self._op("get_paged_mqa_logits_metadata", (ctx, block_kv, num_sms, indices))
        assert a["context_lens"].dtype == torch.int32 and a["context_lens"].dim() == 2
        assert block_kv in (32, 64)
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    def install(self, monkeypatch, dg, next_n: int = 1) -> None:
        monkeypatch.setattr(dg, "_lazy_init", lambda: None)
        monkeypatch.setattr(dg, "_fp8_fp4_mqa_logits_impl", self.mqa_logits)
        monkeypatch.setattr(dg, "_fp8_fp4_paged_mqa_logits_impl", self.paged_mqa_logits)
        monkeypatch.setattr(dg, "_get_paged_mqa_logits_metadata_impl", self.paged_metadata)
        # sm_90's next_n == 4 schedule: one slot per 2-CTA cluster (the GPU decides this
        # through current_platform; the CPU has no platform to ask).
        monkeypatch.setattr(
            dg, "_paged_mqa_logits_schedule_slots", lambda n, nn: n // (2 if nn == 4 else 1)
        )


def deepgemm_on_gpu():
    require_capability(
        "DeepGEMM's FP8 MQA logits with fp32 key scales are sm_90 kernels",
        lambda major, _: major == 9,
    )
    dg = importlib.import_module("vllm.utils.deep_gemm")
    if not dg.is_deep_gemm_supported():
        pytest.fail("vLLM reports DeepGEMM unsupported on this sm_90 GPU (VLLM_USE_DEEP_GEMM=0?)")
    return dg


def num_sms_of(device) -> int:
    from vllm.utils.platform_utils import num_compute_units

    return num_compute_units(torch.device(device).index or 0)


# ---------------------------------------------------------------------- indexer inputs


@dataclasses.dataclass
class PrefillLogitsCase:
    q: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    w: torch.Tensor
    ks: torch.Tensor
    ke: torch.Tensor
    width: int

    def args(self, q=None, k=None, k_scale=None):
        """``fp8_fp4_mqa_logits``'s arguments, as the sparse indexer passes them."""
        return (
            (self.q if q is None else q, None),
            (self.k if k is None else k, self.k_scale if k_scale is None else k_scale),
            self.w,
            self.ks,
            self.ke,
            self.width,
        )


def oracle_prefill_logits(reqs, heads, seed, device, ratio=1) -> PrefillLogitsCase:
    """A prefill chunk in the layout of vLLM's gather workspace: keys ``[N, 128]`` e4m3,
    their scales as the ``[N, 4]`` uint8 workspace viewed fp32 and squeezed (what
    ``sparse_attn_indexer`` hands DeepGEMM), rows' key ranges in DeepGEMM's form."""
    q, k, k_scale, w, ks, ke, width = make_prefill(reqs, ratio, heads, seed=seed, device=device)
    scale_ws = k_scale.contiguous().view(torch.uint8).view(-1, 4)  # the workspace's bytes
    return PrefillLogitsCase(q, k, scale_ws.view(torch.float32).squeeze(-1), w, ks, ke, width)


@dataclasses.dataclass
class PagedLogitsCase:
    q: torch.Tensor  # [B, next_n, H, 128] e4m3
    cache: torch.Tensor  # [blocks, bs, 132] uint8 (the index cache as allocated)
    w: torch.Tensor
    ctx: torch.Tensor
    table: torch.Tensor
    width: int

    @property
    def block_size(self) -> int:
        return self.cache.shape[1]

    def args(self, meta, q=None, cache=None):
        """``fp8_fp4_paged_mqa_logits``'s arguments as the indexer passes them (the
        cache through ``kv_cache_as_quant_view``: ``unsqueeze(-2)``)."""
        cache = self.cache if cache is None else cache
        q = self.q if q is None else q
        return ((q, None), cache.unsqueeze(-2), self.w, self.ctx, self.table, meta, self.width)


def oracle_paged_logits(lens, block_size, heads, next_n, seed, device) -> PagedLogitsCase:
    cache, table, q, w = make_paged(
        lens, block_size, heads, next_n, seed=seed, device=device, pad=index_cache_pad(block_size)
    )
    return PagedLogitsCase(
        q, cache, w, paged_context_lens(lens, next_n, device), table, INDEX_WIDTH
    )


def logits_refs_prefill(c: PrefillLogitsCase):
    args = (c.q.cpu(), c.k.cpu(), c.k_scale.cpu(), c.w.cpu(), c.ks.cpu(), c.ke.cpu(), c.width)
    lens = (torch.minimum(c.ke.cpu(), torch.tensor(c.k.shape[0])) - c.ks.cpu()).clamp(0, c.width)
    inside = torch.arange(c.width)[None, :] < lens[:, None]
    return mqa_logits_ref(*args), mqa_logits_ref(*args, magnitude=True), inside


def logits_refs_paged(c: PagedLogitsCase):
    args = (c.q.cpu(), c.cache.cpu(), c.w.cpu(), c.ctx.cpu(), c.table.cpu(), c.width)
    B, next_n = c.q.shape[:2]
    row_len = row_lengths(c.ctx.cpu(), B, next_n).clamp(max=c.width)
    inside = torch.arange(c.width)[None, :] < row_len[:, None]
    return paged_mqa_logits_ref(*args), paged_mqa_logits_ref(*args, magnitude=True), inside


def check_logits(name, ours, theirs, want, mag, inside, heads, oracle_slack=1.0) -> dict:
    """Inside each row's keys: DeepGEMM within ``2**-8`` (+ fp32) of the magnitude of the
    exact logit; ours within that plus our fp32 budget of DeepGEMM's logit.
    ``oracle_slack`` scales the oracle's allowance in the second bound (2 = its worst
    case when a stand-in with no error plays it)."""
    ours, theirs = ours.cpu()[inside].double(), theirs.cpu()[inside].double()
    want, mag = want[inside].double(), mag[inside].double()
    oracle = (DEEPGEMM_HEAD_DOT + fp32_budget(heads)) * mag
    err = (theirs - want).abs()
    assert torch.isfinite(theirs).all() and (err <= oracle).all(), (
        f"{name}: the oracle misses its allowance at {int((err > oracle).sum())} logits, "
        f"worst {float((err / oracle.clamp_min(1e-300)).max()):.3g}x"
    )
    bound = (oracle_slack * DEEPGEMM_HEAD_DOT + 2 * fp32_budget(heads)) * mag
    diff = (ours - theirs).abs()
    worst = float((diff / bound.clamp_min(1e-300)).max()) if diff.numel() else 0.0
    assert torch.isfinite(ours).all() and (diff <= bound).all(), (
        f"{name}: {int((diff > bound).sum())} of {diff.numel()} logits off the budget "
        f"against the oracle; worst {worst:.3g}x"
    )
    return {"worst_vs_bound": worst, "oracle_worst": float((err / oracle.clamp_min(1e-300)).max())}


LOGITS_REJECTS = "logits off the budget against the oracle"
INDEXER_MUTANTS = [m for m in mutants.MUTANTS if m != "ignore-sink"]  # no sink here


def _aligned_weights(rows: int, heads: int, device) -> torch.Tensor:
    w = torch.full((rows, heads), 2.0**-7)
    w[:, 0], w[:, 1] = 1.0, 0.25
    return w.to(device)


def mutant_prefill_logits(device) -> PrefillLogitsCase:
    """Rows whose head queries copy one of their keys (head 1: another key), with
    positive head weights: those logits equal their magnitude, so a mutant's change shows
    above DeepGEMM's allowance. Row 0 copies key 5 (the scale and neighbour mutants' key),
    row 1 key 20 (inside the dropped 16-key tile)."""
    c = oracle_prefill_logits(PREFILL_REQS[0], 32, seed=4, device=device)
    kb = c.k.view(torch.uint8).cpu()
    ks, ke = c.ks.cpu(), c.ke.cpu()
    q = torch.empty(c.q.shape, dtype=torch.uint8)
    for r in range(q.shape[0]):
        n = int(ke[r] - ks[r])
        target = {0: 5, 1: 20}.get(r, int(ks[r]) + (7 * r) % max(n - 1, 1))
        other = target + 1 if n > 1 else target
        assert ks[r] <= target and other < ke[r]
        q[r] = kb[target]
        q[r, 1] = kb[other]
    c.q = q.view(torch.float8_e4m3fn).to(device)
    c.w = _aligned_weights(q.shape[0], 32, device)
    return c


def prefill_logits_mutant(c: PrefillLogitsCase, mutant: str, ours):
    if mutant == "scale":
        return mutants.scale(ours)
    if mutant == "drop-tile":
        return mutants.zero_column_tile(ours)
    if mutant == "ue8m0-exponent":
        args = c.args(k_scale=mutants.shift_scale_exponent(c.k_scale, 5))
    elif mutant == "neighbour-row":
        k, k_scale = mutants.read_neighbour_key(c.k, c.k_scale, 5)
        args = c.args(k=k, k_scale=k_scale)
    elif mutant == "swap-heads":
        args = c.args(q=mutants.swap_heads(c.q.view(torch.uint8), 0, 1, dim=1).view(c.q.dtype))
    else:
        raise ValueError(mutant)
    return fp8_fp4_mqa_logits(*args)


def mutant_paged_logits(device) -> PagedLogitsCase:
    """Two requests, next_n 2: rows copy one of their request's keys as above; row 0
    (request 0) copies position 5, row 1 position 20."""
    c = oracle_paged_logits([300, 70], 64, 32, 2, seed=5, device=device)
    values, _ = index_page_views(c.cache.cpu(), 64)
    table = c.table.cpu()

    def key(b, p):
        return values[table[b, p // 64], p % 64]

    q = torch.empty(c.q.shape, dtype=torch.uint8)
    for b, picks in enumerate(((5, 20), (7, 33))):
        for j, p in enumerate(picks):
            q[b, j] = key(b, p)
            q[b, j, 1] = key(b, p + 1)
    c.q = q.view(torch.float8_e4m3fn).to(device)
    c.w = _aligned_weights(4, 32, device)
    return c


def _cache_copy(cache: torch.Tensor) -> torch.Tensor:
    return cache_bytes(cache).clone().as_strided(cache.shape, cache.stride())


def paged_logits_mutant(c: PagedLogitsCase, mutant: str, ours, meta):
    if mutant == "scale":
        return mutants.scale(ours)
    if mutant == "drop-tile":
        return mutants.zero_column_tile(ours)
    slot = int(c.table[0, 0]), 5  # request 0, position 5
    if mutant == "ue8m0-exponent":
        cache = _cache_copy(c.cache)
        _, scales = index_page_views(cache, c.block_size)
        scales[slot] *= 2.0
        args = c.args(meta, cache=cache)
    elif mutant == "neighbour-row":
        cache = _cache_copy(c.cache)
        values, scales = index_page_views(cache, c.block_size)
        values[slot] = values[slot[0], 6].clone()
        scales[slot] = scales[slot[0], 6].clone()
        args = c.args(meta, cache=cache)
    elif mutant == "swap-heads":
        args = c.args(
            meta, q=mutants.swap_heads(c.q.view(torch.uint8), 0, 1, dim=2).view(c.q.dtype)
        )
    else:
        raise ValueError(mutant)
    return fp8_fp4_paged_mqa_logits(*args)


# ---------------------------------------------------------------------- GPU: DeepGEMM


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("reqs", PREFILL_REQS, ids=["three-requests", "long-and-short"])
def test_prefill_logits_equal_deepgemm(device, heads, reqs):
    deepgemm_on_gpu()
    c = oracle_prefill_logits(reqs, heads, seed=heads + len(reqs), device=device)
    theirs = vllm_own("vllm.utils.deep_gemm", "fp8_fp4_mqa_logits")(*c.args())
    ours = fp8_fp4_mqa_logits(*c.args())
    record(
        f"prefill logits H{heads} {len(reqs)} requests",
        check_logits("prefill", ours, theirs, *logits_refs_prefill(c), heads),
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads,next_n,block_size", [(64, 1, 64), (32, 1, 32), (64, 2, 64), (32, 2, 64), (32, 4, 64)]
)
def test_paged_logits_equal_deepgemm(device, heads, next_n, block_size):
    deepgemm_on_gpu()
    c = oracle_paged_logits(
        PAGED_LENS, block_size, heads, next_n, seed=heads + next_n, device=device
    )
    meta = vllm_own("vllm.utils.deep_gemm", "get_paged_mqa_logits_metadata")(
        c.ctx, block_size, num_sms_of(device)
    )
    theirs = vllm_own("vllm.utils.deep_gemm", "fp8_fp4_paged_mqa_logits")(*c.args(meta))
    ours = fp8_fp4_paged_mqa_logits(*c.args(get_paged_mqa_logits_metadata(c.ctx, block_size, 1)))
    report = check_logits("paged", ours, theirs, *logits_refs_paged(c), heads)
    record(f"paged logits H{heads} next_n {next_n} bs {block_size}", report)


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", INDEXER_MUTANTS)
def test_logits_mutants_fail_against_deepgemm(device, mutant):
    deepgemm_on_gpu()
    dg_prefill = vllm_own("vllm.utils.deep_gemm", "fp8_fp4_mqa_logits")
    c = mutant_prefill_logits(device)
    refs = logits_refs_prefill(c)
    theirs, ours = dg_prefill(*c.args()), fp8_fp4_mqa_logits(*c.args())
    check_logits("prefill", ours, theirs, *refs, 32)
    with pytest.raises(AssertionError, match=LOGITS_REJECTS):
        check_logits("prefill", prefill_logits_mutant(c, mutant, ours), theirs, *refs, 32)

    p = mutant_paged_logits(device)
    meta = vllm_own("vllm.utils.deep_gemm", "get_paged_mqa_logits_metadata")(
        p.ctx, p.block_size, num_sms_of(device)
    )
    theirs = vllm_own("vllm.utils.deep_gemm", "fp8_fp4_paged_mqa_logits")(*p.args(meta))
    ours_meta = get_paged_mqa_logits_metadata(p.ctx, p.block_size, 1)
    ours = fp8_fp4_paged_mqa_logits(*p.args(ours_meta))
    refs = logits_refs_paged(p)
    check_logits("paged", ours, theirs, *refs, 32)
    with pytest.raises(AssertionError, match=LOGITS_REJECTS):
        check_logits("paged", paged_logits_mutant(p, mutant, ours, ours_meta), theirs, *refs, 32)


# ---------------------------------------------------------------------- CPU: DeepGEMM inputs


def test_prefill_logits_inputs_are_the_indexers_workspaces():
    """Keys and scales have the shapes and dtypes of vLLM's gather workspace
    (``_gather_workspace_shapes``: ``[N, 128]`` fp8 and ``[N, 4]`` uint8, the latter viewed
    fp32 and squeezed as the indexer does)."""
    from vllm.model_executor.layers.sparse_attn_indexer import _gather_workspace_shapes

    c = oracle_prefill_logits(PREFILL_REQS[1], 64, seed=1, device="cpu")
    (values, scales) = _gather_workspace_shapes(c.k.shape[0], 128, torch.float8_e4m3fn, False)
    assert values == ((c.k.shape[0], 128), torch.float8_e4m3fn) and c.k.dtype == values[1]
    assert c.k.shape == values[0] and c.k.is_contiguous()
    assert scales == ((c.k.shape[0], 4), torch.uint8)
    assert c.k_scale.shape == (c.k.shape[0],) and c.k_scale.dtype == torch.float32
    assert c.q.dtype == torch.float8_e4m3fn and c.w.dtype == torch.float32
    assert c.ks.dtype == c.ke.dtype == torch.int32


@pytest.mark.parametrize("block_size", [32, 64])
def test_index_cache_pages_are_vllms(block_size):
    """The index cache: ``[blocks, bs, 132]`` uint8 with positions' values then their
    fp32 scales in each page, the page stride a multiple of vLLM's 576-byte alignment
    and of 256, no smaller than vLLM's page for this cache (``MLAAttentionSpec`` of
    132-byte states)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    c = oracle_paged_logits([70, 3], block_size, 32, 1, seed=1, device="cpu")
    spec = MLAAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=132, dtype=torch.uint8, alignment=576
    )
    stride = c.cache.stride(0)
    assert c.cache.shape[1:] == (block_size, 132) and c.cache.stride()[1:] == (132, 1)
    assert stride % 576 == 0 and stride % 256 == 0 and stride >= spec.page_size_bytes


@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_paged_logits_call_reaches_deepgemm_as_its_schema_requires(device, monkeypatch, next_n):
    """vLLM's ``get_paged_mqa_logits_metadata`` and ``fp8_fp4_paged_mqa_logits`` wrappers
    (``vllm.utils.deep_gemm``) on the GPU test's inputs reach DeepGEMM's ops with
    arguments that bind to their schemas and meet their requirements; ours (on the test
    device) takes the same arguments."""
    dg = importlib.import_module("vllm.utils.deep_gemm")
    fake = DeepGEMMOnCPU()
    fake.install(monkeypatch, dg)
    heads = 32 if next_n == 4 else 64
    c = oracle_paged_logits(PAGED_LENS, 64, heads, next_n, seed=1, device="cpu")
    meta = dg.get_paged_mqa_logits_metadata(c.ctx, c.block_size, fake.num_sms)
    out = dg.fp8_fp4_paged_mqa_logits(*c.args(meta))
    assert [name for name, _ in fake.calls] == [
        "get_paged_mqa_logits_metadata",
        "fp8_fp4_paged_mqa_logits",
    ]
    assert out.shape == (len(PAGED_LENS) * next_n, INDEX_WIDTH)
    c = oracle_paged_logits(PAGED_LENS, 64, heads, next_n, seed=1, device=device)
    ours = fp8_fp4_paged_mqa_logits(*c.args(get_paged_mqa_logits_metadata(c.ctx, 64, 1)))
    assert ours.shape == out.shape and ours.dtype == torch.float32


@pytest.mark.parametrize("heads", [32, 64])
def test_prefill_logits_call_reaches_deepgemm_as_its_schema_requires(monkeypatch, heads):
    dg = importlib.import_module("vllm.utils.deep_gemm")
    fake = DeepGEMMOnCPU()
    fake.install(monkeypatch, dg)
    c = oracle_prefill_logits(PREFILL_REQS[0], heads, seed=2, device="cpu")
    out = dg.fp8_fp4_mqa_logits(*c.args())
    ((name, a),) = fake.calls
    assert name == "fp8_fp4_mqa_logits" and a["max_seqlen_k"] == c.width
    assert out.shape == (c.q.shape[0], c.width)


def test_deepgemm_requirement_checks_can_fail(monkeypatch):
    dg = importlib.import_module("vllm.utils.deep_gemm")
    fake = DeepGEMMOnCPU()
    fake.install(monkeypatch, dg)
    c = oracle_paged_logits([70, 3], 64, 32, 2, seed=1, device="cpu")
    meta = dg.get_paged_mqa_logits_metadata(c.ctx, 64, fake.num_sms)
    with pytest.raises(AssertionError):  # [B, 1] lengths with next_n 2
        dg.fp8_fp4_paged_mqa_logits(
            *dataclasses.replace(c, ctx=c.ctx[:, :1].contiguous()).args(meta)
        )
    with pytest.raises(AssertionError):  # a 68-byte (MXFP4) cache
        dg.fp8_fp4_paged_mqa_logits(*dataclasses.replace(c, cache=c.cache[..., :68]).args(meta))
    p = oracle_prefill_logits(PREFILL_REQS[0], 32, seed=1, device="cpu")
    with pytest.raises(AssertionError):  # bf16 weights (sm_100's)
        dg.fp8_fp4_mqa_logits(*dataclasses.replace(p, w=p.w.bfloat16()).args())


def test_logits_comparison_rejects_every_mutant_with_a_stand_in(device):
    """Ours on the GPU test's mutant cases against a stand-in oracle with no error (the
    exact logits in fp32), its allowance doubled in the comparison: a mutant that fails
    here also fails against any oracle that meets its allowance."""
    c = mutant_prefill_logits(device)
    want, mag, inside = logits_refs_prefill(c)
    ours = fp8_fp4_mqa_logits(*c.args())
    stand_in = want.float()
    check_logits("prefill", ours, stand_in, want, mag, inside, 32, oracle_slack=2.0)
    for mutant in INDEXER_MUTANTS:
        bad = prefill_logits_mutant(c, mutant, ours)
        with pytest.raises(AssertionError, match=LOGITS_REJECTS):
            check_logits("prefill", bad, stand_in, want, mag, inside, 32, oracle_slack=2.0)
    p = mutant_paged_logits(device)
    meta = get_paged_mqa_logits_metadata(p.ctx, p.block_size, 1)
    want, mag, inside = logits_refs_paged(p)
    ours = fp8_fp4_paged_mqa_logits(*p.args(meta))
    stand_in = want.float()
    check_logits("paged", ours, stand_in, want, mag, inside, 32, oracle_slack=2.0)
    for mutant in INDEXER_MUTANTS:
        bad = paged_logits_mutant(p, mutant, ours, meta)
        with pytest.raises(AssertionError, match=LOGITS_REJECTS):
            check_logits("paged", bad, stand_in, want, mag, inside, 32, oracle_slack=2.0)


# ====================================================================== TileLang mHC


MHC_TOKENS = [1, 7, 12, 16, 32, 33, 128, 1024]
MHC_MUTANTS = ["scale", "neighbour-row", "swap-heads"]  # as test_mhc.py: no tiles or sinks
MHC_FLAGS = [
    {"pre_mix": True, "norm": True},
    {"pre_mix": False, "norm": True},
    {"pre_mix": True, "norm": False},
    {"pre_mix": True, "norm": True, "capture_aux": True},
]


def mhc_kwargs(inp, *, pre_mix=True, norm=True, capture_aux=False) -> dict:
    """Keyword arguments after the twelve positional ones, as DeepSeek-V4.1's decoder
    layer passes them (``mhc_shifted_post_pre``)."""
    return dict(
        pre_mix=inp.pre_mix if pre_mix else None,
        norm_weight=inp.norm_weight if norm else None,
        norm_eps=NORM_EPS,
        capture_aux=capture_aux,
    )


def vllm_mhc_fused_path(num_tokens: int) -> bool:
    """Whether vLLM runs its one fused kernel (post folded into the projection, which
    then reads the unrounded fp32 residual) for this many tokens."""
    from vllm.model_executor.kernels.mhc.tilelang_kernels import mhc_fused_post_pre_split_config

    return mhc_fused_post_pre_split_config(num_tokens, HIDDEN, HC_MULT) is not None


def mhc_references(inp, flags: dict, vllm_fused: bool) -> dict:
    """fp64 and PyTorch-bf16 references of our formulation, and the fp32 coefficients of
    vLLM's formulation (vLLM's torch oracle ``mhc_pre_delayed_torch``, whose ``x`` takes
    the projection's input: the unrounded residual where vLLM fuses)."""
    oracle = importlib.import_module("vllm.model_executor.kernels.mhc.torch")
    cpu = {
        f: getattr(inp, f).cpu()
        for f in (
            "x",
            "residual",
            "post_layer_mix",
            "comb_res_mix",
            "fn",
            "hc_scale",
            "hc_base",
            "pre_mix",
            "norm_weight",
        )
    }
    cpu_inp = dataclasses.replace(inp, **cpu)
    kw = mhc_kwargs(cpu_inp, **flags)
    ref = fused_post_pre_delayed_ref(*cpu_inp.positional(), **kw, dtype=torch.float64)
    bf16 = fused_post_pre_delayed_ref(*cpu_inp.positional(), **kw, dtype=torch.bfloat16)
    args = (cpu["x"], cpu["residual"], cpu["post_layer_mix"], cpu["comb_res_mix"])
    unrounded = post_ref(*args).flatten(1) if vllm_fused else None
    vpost, vcomb, _, vpre = oracle.mhc_pre_delayed_torch(
        ref[0], cpu["fn"], cpu["hc_scale"], cpu["hc_base"], *cpu_inp.positional()[7:],
        pre_mix=kw["pre_mix"], x=unrounded,
    )  # fmt: skip
    return {"ref": ref, "bf16": bf16, "vllm_coefficients": (vpost, vcomb, vpre)}


def check_mhc(ours, theirs, refs) -> dict:
    """bf16 outputs (residual_cur, layer_input, aux) by ``assert_matches_oracle``; each
    fp32 coefficient (post, comb, next_pre) of vLLM's within FP32_ATOL of its own
    formulation's value, ours within 2 FP32_ATOL plus the formulations' gap of vLLM's.
    Returns each output's figures."""
    ref, bf16 = refs["ref"], refs["bf16"]
    figures = {}
    for i, name in ((0, "residual_cur"), (3, "layer_input"), (5, "aux")):
        assert ours[i].shape == theirs[i].shape == ref[i].shape, name
        if ref[i].numel():
            figures[name] = assert_matches_oracle(
                f"mHC {name}",
                ours[i].float().cpu(),
                theirs[i].float().cpu(),
                ref[i].float(),
                bf16[i].float(),
            )
    for i, name, vref in zip(
        (1, 2, 4), ("post", "comb", "next_pre"), refs["vllm_coefficients"], strict=True
    ):
        t, o = theirs[i].double().cpu(), ours[i].double().cpu()
        vref = vref.double().reshape(t.shape)
        assert float((t - vref).abs().max()) <= FP32_ATOL, (
            f"mHC {name}: the oracle misses {FP32_ATOL}"
        )
        gap = (ref[i].double() - vref).abs()
        over = (o - t).abs() - (2 * FP32_ATOL + gap)
        assert not torch.isnan(o).any() and float(over.max()) <= 0, (
            f"mHC {name}: ours off vLLM's by {float(over.max()):.3g} past 2 x {FP32_ATOL} + gap"
        )
        figures[name] = {"max_abs_vs_oracle": float((o - t).abs().max()) if o.numel() else 0.0}
    return figures


def mhc_mutant_outputs(inp, mutant, ours, run):
    """``mutant`` of the fused op's outputs; ``run(inputs)`` reruns ours."""
    if mutant == "neighbour-row":  # token 0 reads token 1's residual rows
        shifted = dataclasses.replace(inp, residual=inp.residual.clone())
        shifted.residual[0] = shifted.residual[1]
        return run(shifted)
    change = mutants.scale if mutant == "scale" else mutants.swap_heads  # streams 0 and 1
    return (change(ours[0]), *ours[1:])


def mhc_fused_on_gpu():
    tl = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang")
    return vllm_own(tl.__name__, "mhc_fused_post_pre_delayed_tilelang")


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", MHC_TOKENS)
def test_mhc_fused_post_pre_equals_vllm_tilelang(device, num_tokens):
    """At every kernel path of both sides: vLLM's fused kernel (<= 32 tokens) and its
    post + split-K projection (DeepGEMM's TF32 GEMM on sm_90, TileLang's on sm_80);
    ours' CUDA-core (< 16) and Tensor Core paths."""
    theirs_fn = mhc_fused_on_gpu()
    inp = model_like_inputs(num_tokens, device, seed=num_tokens)
    flags = MHC_FLAGS[0]
    theirs = theirs_fn(*inp.positional(), **mhc_kwargs(inp, **flags))
    ours = mhc_fused_post_pre_delayed(*inp.positional(), **mhc_kwargs(inp, **flags))
    figures = check_mhc(ours, theirs, mhc_references(inp, flags, vllm_mhc_fused_path(num_tokens)))
    record(f"mhc_fused_post_pre T={num_tokens}", figures)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [6, 33])
@pytest.mark.parametrize("flags", MHC_FLAGS[1:], ids=["no-pre-mix", "no-norm", "aux"])
def test_mhc_fused_variants_equal_vllm_tilelang(device, num_tokens, flags):
    theirs_fn = mhc_fused_on_gpu()
    inp = model_like_inputs(num_tokens, device, seed=7)
    theirs = theirs_fn(*inp.positional(), **mhc_kwargs(inp, **flags))
    ours = mhc_fused_post_pre_delayed(*inp.positional(), **mhc_kwargs(inp, **flags))
    figures = check_mhc(ours, theirs, mhc_references(inp, flags, vllm_mhc_fused_path(num_tokens)))
    record(f"mhc_fused_post_pre T={num_tokens} {sorted(flags.items())}", figures)


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", MHC_MUTANTS)
def test_mhc_mutants_fail_against_vllm_tilelang(device, mutant):
    theirs_fn = mhc_fused_on_gpu()
    inp = model_like_inputs(12, device, seed=12)
    kw = mhc_kwargs(inp)
    theirs = theirs_fn(*inp.positional(), **kw)
    ours = mhc_fused_post_pre_delayed(*inp.positional(), **kw)
    refs = mhc_references(inp, MHC_FLAGS[0], vllm_mhc_fused_path(12))
    check_mhc(ours, theirs, refs)

    def run(changed):
        return mhc_fused_post_pre_delayed(*changed.positional(), **mhc_kwargs(changed))

    with pytest.raises(AssertionError, match=BUDGET_REJECTS):
        check_mhc(mhc_mutant_outputs(inp, mutant, ours, run), theirs, refs)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 7, 128, 1024])
def test_mhc_post_equals_vllm_tilelang(device, num_tokens):
    tl = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang")
    theirs_fn = vllm_own(tl.__name__, "mhc_post_tilelang")
    inp = model_like_inputs(num_tokens, device, seed=num_tokens + 1)
    args = (inp.x, inp.residual, inp.post_layer_mix, inp.comb_res_mix)
    theirs, ours = theirs_fn(*args), mhc_post(*args)
    cpu = [a.cpu() for a in args]
    ref = post_ref(*cpu, dtype=torch.float64)
    bf16 = post_ref(*cpu, dtype=torch.bfloat16)
    same = int((ours.view(torch.int16) == theirs.view(torch.int16)).sum())
    figures = assert_matches_oracle(
        "mhc_post", ours.float().cpu(), theirs.float().cpu(), ref.float(), bf16.float()
    )
    record(f"mhc_post T={num_tokens}", {"bit_equal": same, "elements": ours.numel(), **figures})
    bad = mutants.swap_heads(ours)
    with pytest.raises(AssertionError, match=BUDGET_REJECTS):
        assert_matches_oracle(
            "mhc_post", bad.float().cpu(), theirs.float().cpu(), ref.float(), bf16.float()
        )


# ---------------------------------------------------------------------- CPU: mHC inputs


@pytest.mark.parametrize("num_tokens", [12, 33])
@pytest.mark.parametrize("flags", MHC_FLAGS, ids=["plain", "no-pre-mix", "no-norm", "aux"])
def test_mhc_inputs_pass_vllms_checks_up_to_the_launch(monkeypatch, num_tokens, flags):
    """vLLM's ``mhc_fused_post_pre_delayed_tilelang`` runs on CPU with the GPU test's
    inputs (hidden 5120, hc 4) through every check it makes, to the launch of its fused
    kernel (12 tokens) or its post kernel (33)."""
    kernels = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang_kernels")
    monkeypatch.setattr(kernels, "_MHC_FUSED_TILELANG_KERNEL", launch_stand_in("fused"))
    monkeypatch.setattr(kernels, "_MHC_POST_TILELANG_KERNEL", launch_stand_in("post"))
    tl = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang")
    inp = model_like_inputs(num_tokens, "cpu", seed=num_tokens)
    inspect.signature(tl.mhc_fused_post_pre_delayed_tilelang).bind(
        *inp.positional(), **mhc_kwargs(inp, **flags)
    )
    with pytest.raises(ReachedLaunchError) as reached:
        tl.mhc_fused_post_pre_delayed_tilelang(*inp.positional(), **mhc_kwargs(inp, **flags))
    assert reached.value.name == ("fused" if vllm_mhc_fused_path(num_tokens) else "post")
    # what vLLM checks after the launch, on the norm weight
    assert inp.norm_weight.shape == (HIDDEN,) and inp.norm_weight.dtype == torch.bfloat16
    assert inp.norm_weight.is_contiguous()
    comb, residual, post, x = reached.value.args_[:4]
    assert comb is inp.comb_res_mix and residual is inp.residual and x is inp.x
    assert residual.shape == (num_tokens, HC_MULT, HIDDEN) and post.shape == (num_tokens, HC_MULT)


def test_mhc_post_inputs_reach_vllms_launch(monkeypatch):
    kernels = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang_kernels")
    monkeypatch.setattr(kernels, "_MHC_POST_TILELANG_KERNEL", launch_stand_in("post"))
    tl = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang")
    inp = model_like_inputs(7, "cpu", seed=8)
    with pytest.raises(ReachedLaunchError) as reached:
        tl.mhc_post_tilelang(inp.x, inp.residual, inp.post_layer_mix, inp.comb_res_mix)
    a = reached.value.args_
    assert a[0] is inp.comb_res_mix and a[1] is inp.residual and a[3] is inp.x
    assert a[4].shape == inp.residual.shape and a[5:] == (HC_MULT, HIDDEN)


# ====================================================================== cache writers


_C_SO = VLLM_DIR / "_C_stable_libtorch.abi3.so"
WRITER_TOKENS = 37


def triton_fp8_on_gpu():
    """vLLM's Triton writers and gathers convert to fp8e4nv: sm_89 and newer."""
    require_capability(
        "vLLM's Triton cache kernels use fp8e4nv, which Triton compiles for sm_89 and newer",
        lambda major, minor: (major, minor) >= (8, 9),
    )


@dataclasses.dataclass
class WriterCase:
    latent: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    cos_sin: torch.Tensor
    num_blocks: int
    block_size: int


def writer_case(ratio, block_size, n, seed, device) -> WriterCase:
    """bf16 latents across 10 decades with spikes, int64 positions and slots (-1 = skip)
    as vLLM's slot mappings carry them, fp32 ``[max_pos, 64]`` cos|sin rows."""
    num_blocks = -(-n // block_size) + 2
    slots, positions = _slots_positions(n, num_blocks * block_size, seed=seed + ratio)
    return WriterCase(
        _latents(n, seed).to(device),
        positions.to(device),
        slots.to(device),
        _rope_table().to(device),
        num_blocks,
        block_size,
    )


def assert_bytes_equal_and_record(ours, theirs, what: str, case: str) -> None:
    ours, theirs = move_cache(ours, "cpu"), move_cache(theirs, "cpu")
    _assert_same_bytes(ours, theirs, what)
    record(case, {"bytes_equal": int(cache_bytes(ours).numel())})


def v4_cache(c: WriterCase, device) -> torch.Tensor:
    """A 0xFF-poisoned V4 cache, pages padded past vLLM's 576-aligned size."""
    return move_cache(
        paged_cache(c.num_blocks, c.block_size, page_bytes=page_bytes(c.block_size) + 576), device
    )


@pytest.mark.gpu
@pytest.mark.parametrize("ratio", [1, 2])
def test_compressed_kv_insert_bytes_equal_vllms(device, ratio):
    triton_fp8_on_gpu()
    theirs_fn = vllm_own(f"{_V41_OPS}.fused_compress_quant_cache", "rope_quant_insert")
    c = writer_case(ratio, KERNEL_BLOCK_SM90 // ratio, WRITER_TOKENS, seed=ratio, device=device)
    ours, theirs = v4_cache(c, device), v4_cache(c, device)
    rope_quant_insert(c.latent, c.positions, c.cos_sin, ours, c.slots, ratio)
    theirs_fn(c.latent, c.positions, c.cos_sin, theirs, c.slots, ratio)
    assert_bytes_equal_and_record(
        ours, theirs, "compressed KV vs vLLM", f"rope_quant_insert ratio {ratio}"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("ratio,block_size", [(1, 64), (2, 32), (1, 32)])
def test_indexer_k_store_bytes_equal_vllms(device, ratio, block_size):
    triton_fp8_on_gpu()
    theirs_fn = vllm_own(f"{_V41_OPS}.indexer_k_store", "indexer_k_norm_rope_store")
    n = WRITER_TOKENS
    num_blocks = -(-n // block_size) + 2
    slots, positions = _slots_positions(n, num_blocks * block_size, seed=ratio + 3)
    args = (
        _random_k_pre(n + 2, 2).to(device),
        positions.to(device),
        _rope_table().to(device),
        _norm_weight(ratio).to(device),
        1e-6,
    )
    ours, theirs = (move_cache(_index_cache(num_blocks, block_size, 64), device) for _ in range(2))
    indexer_k_norm_rope_store(*args, ours, slots.to(device), ratio, False)
    theirs_fn(*args, theirs, slots.to(device), ratio, False)
    assert_bytes_equal_and_record(
        ours,
        theirs,
        "indexer K vs vLLM",
        f"indexer_k_norm_rope_store ratio {ratio} bs {block_size}",
    )


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [32, 64])
def test_generic_k_insert_bytes_equal_vllms(device, block_size):
    triton_fp8_on_gpu()
    theirs_fn = vllm_own(f"{_V41_OPS}.cache_utils", "quantize_and_insert_k_cache")
    c = writer_case(1, block_size, WRITER_TOKENS, seed=5, device=device)
    ours, theirs = v4_cache(c, device), v4_cache(c, device)
    quantize_and_insert_k_cache(c.latent, ours, c.slots, block_size)
    theirs_fn(c.latent, theirs, c.slots, block_size)
    assert_bytes_equal_and_record(
        ours, theirs, "K insert vs vLLM", f"quantize_and_insert_k_cache bs {block_size}"
    )


GATHER_CASES = [
    ([301, 5, 129, 1000], None, 32, 0),  # compressed history, ratio 2 pages
    ([1, 2, 127, 128, 129], None, 64, 0),  # ratio 1 pages
    ([300, 5, 129, 1000], [140, 5, 1, 0], SWA_BLOCK, 77),  # SWA tails after N rows
]


@pytest.mark.gpu
@pytest.mark.parametrize("seq_lens,gather_lens,block_size,offset", GATHER_CASES)
def test_gather_bits_equal_vllms(device, seq_lens, gather_lens, block_size, offset):
    """vLLM's dispatcher (CuteDSL whenever ``cutlass`` imports, as on the H200's stack)
    and its Triton gather, natively: our gather's bits, NaN where neither writes."""
    triton_fp8_on_gpu()
    cu = importlib.import_module(f"{_V41_OPS}.cache_utils")
    dispatch = vllm_own(cu.__name__, "dequantize_and_gather_k_cache")
    triton_gather = vllm_own(cu.__name__, "dequantize_and_gather_k_cache_triton")
    cache, sl, gl, table, rows = gather_case(seq_lens, gather_lens, block_size, offset, device)
    outs = {}
    for name, fn in (
        ("ours", dequantize_and_gather_k_cache),
        ("vllm", dispatch),
        ("triton", triton_gather),
    ):
        outs[name] = nan_empty(len(seq_lens), rows, 512, device=device)
        fn(outs[name], cache, sl, gl, table, block_size, offset)
    for name in ("vllm", "triton"):
        a, b = outs["ours"], outs[name]
        same = (a.view(torch.int16) == b.view(torch.int16)) | (a.isnan() & b.isnan())
        assert same.all(), f"vs {name}: {int((~same).sum())} elements differ"
    record(
        f"gather lens {seq_lens} bs {block_size} offset {offset}",
        {
            "vllm_dispatch": "CuteDSL" if cu.has_cutedsl() else "Triton",
            "elements_bit_equal": outs["ours"].numel(),
        },
    )


@pytest.mark.gpu
def test_swa_cuda_writer_records_equal_ours(device):
    """The SWA cache our decode reads is written by vLLM's CUDA
    ``fused_deepseek_v4_kv_rope_insert`` (sm_80 code too). Our compressed writer at ratio
    1 does the same maths (GPT-J RoPE on the last 64 dims, UE8M0 fp8 NoPE): the NoPE and
    scale bytes must equal, the RoPE bf16 within one ulp (FMA contraction)."""
    import vllm._C_stable_libtorch  # noqa: F401  (registers torch.ops._C, as vLLM does on CUDA)

    c = writer_case(1, SWA_BLOCK, WRITER_TOKENS, seed=9, device=device)
    ours, theirs = v4_cache(c, device), v4_cache(c, device)
    rope_quant_insert(c.latent, c.positions, c.cos_sin, ours, c.slots, 1)
    torch.ops._C.fused_deepseek_v4_kv_rope_insert(
        c.latent, theirs, c.slots, c.positions, c.cos_sin, SWA_BLOCK, None, False
    )
    (od, os_), (td, ts) = (
        page_views(move_cache(ours, "cpu"), SWA_BLOCK),
        page_views(move_cache(theirs, "cpu"), SWA_BLOCK),
    )
    assert torch.equal(od[..., :448], td[..., :448]) and torch.equal(os_, ts)
    rope_o = od[..., 448:].contiguous().view(torch.int16).int()
    rope_t = td[..., 448:].contiguous().view(torch.int16).int()
    assert int((rope_o - rope_t).abs().max()) <= 1
    pad_o, pad_t = cache_bytes(move_cache(ours, "cpu")), cache_bytes(move_cache(theirs, "cpu"))
    assert torch.equal(pad_o[:, SWA_BLOCK * RECORD_BYTES :], pad_t[:, SWA_BLOCK * RECORD_BYTES :])


# ---------------------------------------------------------------------- CPU: writer inputs


def test_writer_calls_bind_to_vllms_signatures():
    """The GPU tests' calls of vLLM's writers and gathers bind to their signatures, and
    the SWA writer's call to the CUDA op's schema (from ``_C_stable_libtorch.abi3.so``)."""
    comp = importlib.import_module(f"{_V41_OPS}.fused_compress_quant_cache")
    idx = importlib.import_module(f"{_V41_OPS}.indexer_k_store")
    cu = importlib.import_module(f"{_V41_OPS}.cache_utils")
    c = writer_case(2, 32, WRITER_TOKENS, seed=2, device="cpu")
    cache = v4_cache(c, "cpu")
    inspect.signature(comp.rope_quant_insert).bind(
        c.latent, c.positions, c.cos_sin, cache, c.slots, 2
    )
    inspect.signature(idx.indexer_k_norm_rope_store).bind(
        _random_k_pre(4, 1),
        c.positions,
        c.cos_sin,
        _norm_weight(1),
        1e-6,
        _index_cache(3, 32),
        c.slots,
        2,
        False,
    )
    inspect.signature(cu.quantize_and_insert_k_cache).bind(c.latent, cache, c.slots, 32)
    gcache, sl, gl, table, rows = gather_case(*GATHER_CASES[2][:2], SWA_BLOCK, 77, "cpu")
    out = nan_empty(4, rows, 512)
    for fn in (cu.dequantize_and_gather_k_cache, cu.dequantize_and_gather_k_cache_triton):
        inspect.signature(fn).bind(out, gcache, sl, gl, table, SWA_BLOCK, 77)
    schema = compiled_op_schema(_C_SO, "fused_deepseek_v4_kv_rope_insert")
    a = bind_to_schema(
        schema, (c.latent, cache, c.slots, c.positions, c.cos_sin, SWA_BLOCK, None, False)
    )
    assert a["kv"].dtype == torch.bfloat16 and a["k_cache"].dtype == torch.uint8
    assert a["slot_mapping"].dtype == a["position_ids"].dtype == torch.int64
    assert a["cos_sin_cache"].shape[1] == 64


def test_writer_cases_are_vllms_layouts():
    """int64 slot mappings with -1, int64 positions, bf16 latents ``[T, 512]``, V4 caches
    ``[blocks, bs, 584]`` over 576-aligned (and padded) pages, 132-byte index records."""
    c = writer_case(1, 64, WRITER_TOKENS, seed=1, device="cpu")
    assert c.slots.dtype == c.positions.dtype == torch.int64 and (c.slots == -1).any()
    assert c.latent.shape == (WRITER_TOKENS, 512) and c.latent.dtype == torch.bfloat16
    cache = v4_cache(c, "cpu")
    assert cache.shape[1:] == (64, RECORD_BYTES) and cache.stride(0) % 576 == 0
    assert cache.stride(0) > page_bytes(64)
    idx = _index_cache(3, 64, 64)
    assert idx.shape[1:] == (64, 132) and idx.stride()[1:] == (132, 1)


# ====================================================================== CPU rehearsals


@pytest.fixture
def rehearsal(monkeypatch):
    """Runs the GPU tests' own bodies on CPU: vLLM's launches are replaced by stand-ins
    that go through vLLM's wrapper code (FlashMLA's interface file, ``vllm.utils.
    deep_gemm``), bind to the compiled ops' schemas, meet their requirements and return
    what a correct kernel returns (the references, correctly rounded); the capability
    gates pass. Everything else is the GPU test as written, ours included (Triton under
    the interpreter), so only the launch of vLLM's kernels is left to the GPU."""
    module = sys.modules[__name__]
    # The stand-ins are not the oracles: their figures must not join the published record.
    monkeypatch.delenv(ORACLE_RECORD_ENV, raising=False)
    flashmla = FlashMLAOnCPU(compute=True)
    monkeypatch.setattr(module, "flashmla_on_gpu", lambda: flashmla_interface_on_cpu(flashmla))
    dg = importlib.import_module("vllm.utils.deep_gemm")
    deepgemm = DeepGEMMOnCPU(compute=True)
    deepgemm.install(monkeypatch, dg)
    monkeypatch.setattr(module, "deepgemm_on_gpu", lambda: dg)
    monkeypatch.setattr(module, "num_sms_of", lambda device: deepgemm.num_sms)
    monkeypatch.setattr(module, "triton_fp8_on_gpu", lambda: None)
    # The stand-ins round correctly, so their error is the bf16 output rounding alone: a
    # ratio to it says nothing of FlashMLA, which rounds P and the fp8-decoded rows to
    # bf16 as ours does (test_error_ratio_check_can_fail covers the check itself).
    monkeypatch.setattr(module, "FLASHMLA_ERROR_RATIO", None)
    cu = importlib.import_module(f"{_V41_OPS}.cache_utils")
    monkeypatch.setattr(cu, "has_cutedsl", lambda: False)  # its Triton gather on CPU
    return types.SimpleNamespace(flashmla=flashmla, deepgemm=deepgemm)


@pytest.fixture
def named_record_file(tmp_path, monkeypatch):
    """The record file named, as the GPU tier names it (set before ``rehearsal`` runs)."""
    path = tmp_path / "oracle.jsonl"
    monkeypatch.setenv(ORACLE_RECORD_ENV, str(path))
    return path


def test_rehearsals_write_no_oracle_record(device, named_record_file, rehearsal):
    """A rehearsal's figures come from CPU stand-ins, not from vLLM's kernels: with the
    record file named, a rehearsal must not add to it (the published oracle figures are
    read from that file)."""
    test_sparse_mla_decode_equals_flashmla(device, "rehearsal", 8, 0)
    assert rehearsal.flashmla.calls  # the rehearsal did run the comparison
    assert not named_record_file.exists()


@pytest.mark.parametrize("heads,ratio", [(8, 0), (16, 2), (64, 1)])
def test_rehearse_decode_vs_flashmla(device, rehearsal, heads, ratio):
    test_sparse_mla_decode_equals_flashmla(device, "rehearsal", heads, ratio)
    ((op, a),) = rehearsal.flashmla.calls
    assert op == "sparse_decode_fwd" and a["q"].shape == (DECODE_T, 1, PADDED_HEADS, 512)


@pytest.mark.parametrize("mutant", mutants.MUTANTS)
def test_rehearse_decode_mutants_vs_flashmla(device, rehearsal, mutant):
    """The GPU mutant test with a correctly rounding stand-in: the comparison passes ours
    and rejects the mutant."""
    test_sparse_mla_decode_mutants_fail_against_flashmla(device, "rehearsal", mutant)


@pytest.mark.parametrize("heads", [8, 64])
def test_rehearse_prefill_vs_flashmla(device, rehearsal, heads):
    test_sparse_mla_prefill_equals_flashmla(device, "rehearsal", heads)
    ((op, a),) = rehearsal.flashmla.calls
    assert op == "sparse_prefill_fwd" and a["q"].shape[1] == heads


@pytest.mark.parametrize("mutant", PREFILL_MUTANTS)
def test_rehearse_prefill_mutants_vs_flashmla(device, rehearsal, mutant):
    test_sparse_mla_prefill_mutants_fail_against_flashmla(device, "rehearsal", mutant)


@pytest.mark.parametrize("heads,reqs", [(32, PREFILL_REQS[0]), (64, PREFILL_REQS[1])])
def test_rehearse_prefill_logits_vs_deepgemm(device, rehearsal, heads, reqs):
    test_prefill_logits_equal_deepgemm(device, heads, reqs)
    assert [op for op, _ in rehearsal.deepgemm.calls] == ["fp8_fp4_mqa_logits"]


@pytest.mark.parametrize("heads,next_n,block_size", [(64, 2, 64), (32, 4, 64), (32, 1, 32)])
def test_rehearse_paged_logits_vs_deepgemm(device, rehearsal, heads, next_n, block_size):
    test_paged_logits_equal_deepgemm(device, heads, next_n, block_size)
    ops = [op for op, _ in rehearsal.deepgemm.calls]
    assert ops == ["get_paged_mqa_logits_metadata", "fp8_fp4_paged_mqa_logits"]


@pytest.mark.parametrize("mutant", INDEXER_MUTANTS)
def test_rehearse_logits_mutants_vs_deepgemm(device, rehearsal, mutant):
    test_logits_mutants_fail_against_deepgemm(device, mutant)


@cpu_only
def test_rehearse_writers_vs_vllms(rehearsal):
    """The writer and gather GPU tests with vLLM's Triton kernels under the interpreter,
    its fp8 and bf16 casts made the GPU's (``gpu_casts``, test_cache_writers.py), and its
    gather dispatch on Triton (no CuteDSL on a CPU)."""
    with gpu_casts():
        test_compressed_kv_insert_bytes_equal_vllms("cpu", 2)
        test_indexer_k_store_bytes_equal_vllms("cpu", 1, 64)
        test_generic_k_insert_bytes_equal_vllms("cpu", 32)
    test_gather_bits_equal_vllms("cpu", *GATHER_CASES[2])


def vllm_mhc_on_cpu(
    x,
    residual,
    post_layer_mix,
    comb_res_mix,
    fn,
    hc_scale,
    hc_base,
    *scalars,
    pre_mix=None,
    norm_weight=None,
    norm_eps=1e-6,
    capture_aux=False,
):
    """vLLM's fused mHC op on CPU: its torch oracle for the post mixing and the
    coefficients (the projection reading the unrounded residual where vLLM's fused kernel
    runs), the fp32 reference for the normalized layer input and the stream mean.
    ``scalars`` are the op's five positional scalars, passed on as they come (rms_eps,
    hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat)."""
    oracle = importlib.import_module("vllm.model_executor.kernels.mhc.torch")
    residual_cur = oracle.mhc_post_torch(x, residual, post_layer_mix, comb_res_mix)
    fused = vllm_mhc_fused_path(residual.shape[0])
    unrounded = post_ref(x, residual, post_layer_mix, comb_res_mix).flatten(1) if fused else None
    post, comb, _, pre = oracle.mhc_pre_delayed_torch(
        residual_cur, fn, hc_scale, hc_base, *scalars, pre_mix=pre_mix, x=unrounded
    )
    ref = fused_post_pre_delayed_ref(
        x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, *scalars,
        pre_mix=pre_mix, norm_weight=norm_weight, norm_eps=norm_eps, capture_aux=capture_aux,
    )  # fmt: skip
    return residual_cur, post, comb, ref[3], pre, ref[5]


@pytest.fixture
def mhc_rehearsal(monkeypatch):
    """The mHC GPU tests on CPU: vLLM's op is ``vllm_mhc_on_cpu``, its post kernel its
    torch oracle ``mhc_post_torch``; ours (TileLang, GPU only) is played by the fp32
    reference and by ``post_fixed_order`` (bit-identical to our ``mhc_post``,
    test_mhc.py)."""
    module = sys.modules[__name__]
    tl = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang")
    oracle = importlib.import_module("vllm.model_executor.kernels.mhc.torch")
    monkeypatch.setattr(tl, "mhc_fused_post_pre_delayed_tilelang", vllm_mhc_on_cpu)
    monkeypatch.setattr(tl, "mhc_post_tilelang", oracle.mhc_post_torch)
    monkeypatch.setattr(module, "mhc_fused_post_pre_delayed", fused_post_pre_delayed_ref)
    monkeypatch.setattr(module, "mhc_post", lambda *args: post_fixed_order(*args)[0])


@pytest.mark.parametrize("num_tokens", [1, 12, 33])
def test_rehearse_mhc_vs_vllm(mhc_rehearsal, num_tokens):
    test_mhc_fused_post_pre_equals_vllm_tilelang("cpu", num_tokens)


@pytest.mark.parametrize("flags", MHC_FLAGS[1:], ids=["no-pre-mix", "no-norm", "aux"])
def test_rehearse_mhc_variants_vs_vllm(mhc_rehearsal, flags):
    test_mhc_fused_variants_equal_vllm_tilelang("cpu", 6, flags)


@pytest.mark.parametrize("mutant", MHC_MUTANTS)
def test_rehearse_mhc_mutants_vs_vllm(mhc_rehearsal, mutant):
    test_mhc_mutants_fail_against_vllm_tilelang("cpu", mutant)


def test_rehearse_mhc_post_vs_vllm(mhc_rehearsal):
    test_mhc_post_equals_vllm_tilelang("cpu", 7)
