"""dspark-pp-embedding: under PP the DSpark draft loads its own input embedding.

What runs here (CPU, the real vLLM 0.33.0): the weight routing, the PP switch on the
class, and vLLM's own ``maybe_share_target_embed`` accepting the draft on a last stage
whose target embedding is a PPMissingLayer (and refusing vLLM's class there). What
needs GPUs: building the real draft model and loading the 1.3 GB embedding shard.
"""

from types import SimpleNamespace

import pytest
import torch

from tools.tiers import import_or_skip

pytestmark = pytest.mark.vllm
import_or_skip("vllm")


def _weights():
    return [
        ("mtp.0.attn.wq_a.weight", torch.ones(2)),
        ("embed.weight", torch.arange(12.0).reshape(4, 3)),
        ("layers.1.engram.embed.weight", torch.zeros(1)),  # not the input embedding
        ("mtp.1.norm.weight", torch.ones(3)),
    ]


def test_embedding_goes_to_its_parameter_and_the_rest_streams_on():
    from deepinfer_sm80.vllm_plugin.dspark_pp import load_with_own_embedding

    param = torch.nn.Parameter(torch.full((4, 3), float("nan")), requires_grad=False)
    seen = []

    def load_rest(weights):
        for name, _ in weights:
            seen.append(name)
        return {"model.layers.0.attn.wq_a.weight"}

    loaded = load_with_own_embedding(param, _weights(), load_rest)
    assert torch.equal(param, torch.arange(12.0).reshape(4, 3))
    assert seen == [
        "mtp.0.attn.wq_a.weight",
        "layers.1.engram.embed.weight",
        "mtp.1.norm.weight",
    ]
    assert loaded == {"model.layers.0.attn.wq_a.weight", "model.embed_tokens.weight"}


def test_the_parameters_own_loader_is_used():
    from deepinfer_sm80.vllm_plugin.dspark_pp import load_with_own_embedding

    param = torch.nn.Parameter(torch.zeros(2, 3), requires_grad=False)
    calls = []
    param.weight_loader = lambda p, w: calls.append(w.shape)  # e.g. the vocab-parallel one
    load_with_own_embedding(param, _weights(), lambda ws: set(list(ws) and ()))
    assert calls == [torch.Size([4, 3])]


def test_a_checkpoint_without_embed_weight_fails_loudly():
    from deepinfer_sm80.vllm_plugin.dspark_pp import load_with_own_embedding

    param = torch.nn.Parameter(torch.zeros(4, 3), requires_grad=False)
    weights = [w for w in _weights() if w[0] != "embed.weight"]
    with pytest.raises(RuntimeError, match=r"no 'embed\.weight'.*pipeline_parallel 1"):
        load_with_own_embedding(param, weights, lambda ws: set(list(ws) and ()))


def _draft(monkeypatch, pp: int):
    """Our class with vLLM's heavy __init__/load_weights replaced by recorders."""
    from deepinfer_sm80.vllm_plugin import dspark_pp

    monkeypatch.setattr(dspark_pp._VllmDSpark, "__init__", lambda self, **kw: None)
    monkeypatch.setattr(dspark_pp._VllmDSpark, "load_weights", lambda self, ws: {n for n, _ in ws})
    monkeypatch.setattr(dspark_pp, "get_pp_group", lambda: SimpleNamespace(world_size=pp))
    draft = dspark_pp.DSparkPPDeepseekV4ForCausalLM(vllm_config=None)
    draft.model = SimpleNamespace(
        embed_tokens=SimpleNamespace(weight=torch.nn.Parameter(torch.zeros(4, 3)))
    )
    return draft


def test_pp1_is_vllms_behaviour_and_pp3_owns_the_embedding(monkeypatch):
    draft = _draft(monkeypatch, pp=1)
    assert draft.has_own_embed_tokens is False
    assert "embed.weight" in draft.load_weights(_weights())  # passed through, untouched
    draft = _draft(monkeypatch, pp=3)
    assert draft.has_own_embed_tokens is True
    loaded = draft.load_weights(_weights())
    assert "embed.weight" not in loaded and "model.embed_tokens.weight" in loaded
    assert torch.equal(draft.model.embed_tokens.weight, torch.arange(12.0).reshape(4, 3))


def test_vllms_sharing_step_accepts_ours_on_a_last_stage(monkeypatch):
    """The exact failure of 0.33.0 (blocker B) and its fix, in vLLM's own function."""
    from vllm.model_executor.models.utils import PPMissingLayer
    from vllm.models.deepseek_v41.nvidia.dspark import DSparkDeepseekV4ForCausalLM
    from vllm.v1.worker.gpu.spec_decode.eagle import utils as eagle_utils

    monkeypatch.setattr(eagle_utils, "get_pp_group", lambda: SimpleNamespace(world_size=3))
    target_inner = SimpleNamespace(embed_tokens=PPMissingLayer())
    draft_inner = SimpleNamespace(embed_tokens=torch.nn.Embedding(4, 3))
    theirs = object.__new__(DSparkDeepseekV4ForCausalLM)
    with pytest.raises(RuntimeError, match="needs the target input embedding"):
        eagle_utils.maybe_share_target_embed(theirs, draft_inner, target_inner)
    ours = _draft(monkeypatch, pp=3)
    eagle_utils.maybe_share_target_embed(ours, draft_inner, target_inner)  # no error


def test_signature_is_vllms():
    import inspect

    from deepinfer_sm80.vllm_plugin.dspark_pp import DSparkPPDeepseekV4ForCausalLM, _VllmDSpark

    def params(cls):
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]

    assert params(DSparkPPDeepseekV4ForCausalLM) == params(_VllmDSpark)
