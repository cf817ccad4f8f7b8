"""The FlashMLA-signature wrappers: same parameters as vLLM's vendored FlashMLA
interface (read from its source, which needs a GPU to import), same results as the
kernels they wrap."""

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

from deepinfer_sm80.ops.sparse_mla import flashmla_compat, sparse_mla_decode

from .test_sparse_mla import SCALE, make_decode_case, make_prefill_case


def _vllm_flashmla_params(name: str) -> list[tuple[str, str | None]]:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    source = Path(spec.origin).parent / "third_party" / "flashmla" / "flash_mla_interface.py"
    tree = ast.parse(source.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    args = fn.args.args
    defaults = [None] * (len(args) - len(fn.args.defaults)) + [
        ast.unparse(d) for d in fn.args.defaults
    ]
    return [(a.arg, d) for a, d in zip(args, defaults, strict=True)]


def _ours(fn) -> list[tuple[str, str | None]]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append((p.name, None if p.default is inspect.Parameter.empty else repr(p.default)))
    return out


@pytest.mark.vllm
@pytest.mark.parametrize("name", ["flash_mla_with_kvcache", "flash_mla_sparse_fwd"])
def test_signatures_equal_vllms_flashmla(name):
    assert _ours(getattr(flashmla_compat, name)) == _vllm_flashmla_params(name)


def test_decode_wrapper_matches_the_kernel(device):
    case = make_decode_case(3, 64, seed=4, device=device)
    want, want_lse = sparse_mla_decode(
        case.q,
        case.cache,
        case.idx,
        case.lens,
        SCALE,
        case.sink,
        case.extra,
        case.extra_idx,
        case.extra_lens,
    )
    out = torch.empty_like(case.q).unsqueeze(1)
    got, lse = flashmla_compat.flash_mla_with_kvcache(
        q=case.q.unsqueeze(1), k_cache=case.cache.unsqueeze(-2), block_table=None,
        head_dim_v=512, tile_scheduler_metadata=None, cache_seqlens=None,
        is_fp8_kvcache=True, indices=case.idx.unsqueeze(1), topk_length=case.lens,
        softmax_scale=SCALE, attn_sink=case.sink, extra_k_cache=case.extra.unsqueeze(-2),
        extra_indices_in_kvcache=case.extra_idx.unsqueeze(1),
        extra_topk_length=case.extra_lens, out=out,
    )  # fmt: skip
    assert got is out and torch.equal(got[:, 0].view(torch.int16), want.view(torch.int16))
    assert lse.shape == (3, 64, 1) and torch.equal(lse[..., 0], want_lse)


def test_prefill_wrapper_and_refusals(device):
    q, kv, idx, sink = make_prefill_case(2, 16, 50, 128, 1, device)
    out, max_logits, lse = flashmla_compat.flash_mla_sparse_fwd(
        q, kv.unsqueeze(1), idx.unsqueeze(1), SCALE, attn_sink=sink
    )
    assert out.shape == q.shape and max_logits.shape == lse.shape == (2, 16)
    with pytest.raises(ValueError, match=r"d_v: DeepSeek-V4\.1 uses 512"):
        flashmla_compat.flash_mla_sparse_fwd(q, kv, idx, SCALE, d_v=576)
    with pytest.raises(ValueError, match="only sparse attention is served"):
        flashmla_compat.flash_mla_with_kvcache(
            q.unsqueeze(1), None, torch.zeros(1), None, 512, None
        )
