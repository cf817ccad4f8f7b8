"""DSpark over PP: the post-update kernel keeps one specialization (vllm_plugin.pp_broadcast).

- ``steady_outputs`` widens the sampled tokens and realigns the counts, and vLLM 0.33.0's
  own ``post_update`` (under the Triton interpreter) leaves every state buffer exactly as
  it does with the raw outputs;
- Triton's binder for sm_80 sees several specializations of ``_post_update_kernel`` in
  the raw traffic and two (drafts or not) in the steady traffic;
- the pre-warm launches exactly those two with every row skipped, on non-last ranks only.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tools.tiers import import_or_skip

pytestmark = pytest.mark.vllm
import_or_skip("vllm")

MAX_REQS, MAX_LEN, K = 8, 64, 5


def _state(g):
    """The runner's request-state buffers, with vLLM 0.33.0's dtypes (states.py)."""
    return dict(
        num_computed_tokens=torch.randint(0, 9, (MAX_REQS,), generator=g, dtype=torch.int32),
        last_sampled_tokens=torch.zeros(MAX_REQS, 1, dtype=torch.int64),
        all_token_ids=torch.randint(0, 99, (MAX_REQS, MAX_LEN), generator=g, dtype=torch.int32),
        total_len=torch.randint(10, 20, (MAX_REQS,), generator=g, dtype=torch.int32),
        draft_tokens_out=torch.zeros(MAX_REQS, K, dtype=torch.int64),
    )


def _received(num_reqs, width, with_drafts, g):
    """What ``PPHandler.receive`` allocates for one step: ``[num_reqs, width]`` sampled
    tokens and one ``[2, num_reqs]`` int32 buffer split into the two count rows."""
    sampled = torch.randint(1000, 2000, (num_reqs, width), generator=g, dtype=torch.int64)
    combined = torch.empty(2, num_reqs, dtype=torch.int32)
    combined[0] = torch.randint(1, width + 1, (num_reqs,), generator=g, dtype=torch.int32)
    combined[1] = torch.randint(0, width, (num_reqs,), generator=g, dtype=torch.int32)
    idx = torch.randperm(MAX_REQS, generator=g)[:num_reqs]
    idx[2::3] = -1  # requests freed since the receive
    return dict(
        sampled_tokens=sampled,
        num_sampled=combined[0],
        num_rejected=combined[1],
        idx_mapping=idx.to(torch.int64),
        draft_tokens=(
            torch.randint(0, 99, (num_reqs, K), generator=g, dtype=torch.int64)
            if with_drafts
            else None
        ),
    )


def _post_update(outputs, state):
    """vLLM's post_update as a non-last rank's ``postprocess_sampled`` calls it."""
    from vllm.v1.worker.gpu.input_batch import post_update

    post_update(
        outputs["idx_mapping"],
        state["num_computed_tokens"],
        state["last_sampled_tokens"],
        None,
        outputs["sampled_tokens"],
        outputs["num_sampled"],
        outputs["num_rejected"],
        None,
        state["all_token_ids"],
        state["total_len"],
        outputs["draft_tokens"],
        state["draft_tokens_out"],
    )


TRAFFIC = list(itertools.product([1, 2, 3, 4, 5, 8], [1, K + 1], [False, True]))


def test_steady_outputs_widen_and_align():
    from deepinfer_sm80.vllm_plugin.pp_broadcast import ALIGN_BYTES, steady_outputs

    g = torch.Generator().manual_seed(0)
    raw = _received(5, 1, True, g)
    assert raw["num_rejected"].data_ptr() % ALIGN_BYTES != 0  # 5 int32 = 20 bytes in
    steady = steady_outputs(raw, K + 1)
    assert steady["sampled_tokens"].shape == (5, K + 1)
    assert torch.equal(steady["sampled_tokens"][:, :1], raw["sampled_tokens"])
    for key in ("num_sampled", "num_rejected"):
        assert steady[key].data_ptr() % ALIGN_BYTES == 0
        assert torch.equal(steady[key], raw[key])
    assert steady["idx_mapping"] is raw["idx_mapping"]
    assert steady["draft_tokens"] is raw["draft_tokens"]
    # Already steady: handed through without copies.
    again = steady_outputs(steady, K + 1)
    assert all(again[k] is steady[k] for k in steady)
    with pytest.raises(ValueError, match="sampled_tokens"):
        steady_outputs(_received(2, K + 1, False, g), K)


@pytest.mark.parametrize("num_reqs,width,with_drafts", TRAFFIC)
def test_vllms_post_update_is_unchanged_by_steady_outputs(num_reqs, width, with_drafts):
    from deepinfer_sm80.vllm_plugin.pp_broadcast import steady_outputs

    g = torch.Generator().manual_seed(num_reqs * 10 + width)
    raw = _received(num_reqs, width, with_drafts, g)
    base = _state(g)
    got = {k: v.clone() for k, v in base.items()}
    want = {k: v.clone() for k, v in base.items()}
    _post_update(raw, want)
    _post_update(steady_outputs(raw, K + 1), got)
    changed = [k for k in base if not torch.equal(want[k], base[k])]
    assert "total_len" in changed  # the kernel did apply something
    for key in base:
        assert torch.equal(got[key], want[key]), key


def _specializations(traffic_outputs) -> set[str]:
    """Triton's sm_80 specialization of every ``_post_update_kernel`` launch that vLLM's
    ``post_update`` makes for these outputs (the launch is captured, not run)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature
    from vllm.v1.worker.gpu import input_batch

    kernel = input_batch._post_update_kernel
    jit = JITFunction(getattr(kernel, "fn", kernel))
    binder = create_function_from_signature(
        jit.signature, jit.params, make_backend(GPUTarget("cuda", 80, 32))
    )
    launches = []

    class Capture:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append(args)

    original = input_batch._post_update_kernel
    input_batch._post_update_kernel = Capture()
    try:
        g = torch.Generator().manual_seed(3)
        for outputs in traffic_outputs:
            _post_update(outputs, _state(g))
    finally:
        input_batch._post_update_kernel = original
    return {repr(binder(*args, num_warps=1)[1]) for args in launches}


def test_sm80_binder_sees_one_variant_per_draft_mode_in_steady_traffic():
    from deepinfer_sm80.vllm_plugin.pp_broadcast import steady_outputs

    g = torch.Generator().manual_seed(7)
    raw = [_received(n, w, d, g) for n, w, d in TRAFFIC]
    vllm_variants = _specializations(raw)
    steady_variants = _specializations([steady_outputs(o, K + 1) for o in raw])
    # vLLM: width 1 vs K+1 times aligned vs unaligned counts, times drafts or not.
    assert len(vllm_variants) >= 6
    assert len(steady_variants) == 2


def _runner(is_last_rank=False, steps=K):
    g = torch.Generator().manual_seed(11)
    state = _state(g)
    calls = []

    def postprocess_sampled(**outputs):
        calls.append(outputs)
        _post_update(outputs, state)

    from deepinfer_sm80.vllm_plugin.pp_broadcast import SteadyPPHandler

    handler = SteadyPPHandler.__new__(SteadyPPHandler)  # no process group needed here
    handler.is_last_rank = is_last_rank
    handler.max_sample_len, handler.num_speculative_steps = steps + 1, steps
    runner = SimpleNamespace(
        pp_handler=handler, device=torch.device("cpu"), postprocess_sampled=postprocess_sampled
    )
    return runner, state, calls


def test_prewarm_launches_the_two_steady_variants_and_changes_no_state():
    from deepinfer_sm80.vllm_plugin.pp_broadcast import prewarm_post_update, steady_outputs

    runner, state, calls = _runner()
    before = {k: v.clone() for k, v in state.items()}
    assert prewarm_post_update(runner) == 4
    assert all(torch.equal(state[k], before[k]) for k in state)
    assert [c["draft_tokens"] is None for c in calls] == [True, False, True, False]
    assert all(
        c["idx_mapping"].eq(-1).all() and c["idx_mapping"].dtype == torch.int64 for c in calls
    )
    # From a one-column, unaligned receive too, so the widening and copy kernels load.
    assert [c["sampled_tokens"].shape for c in calls] == [(5, K + 1)] * 2 + [(4, K + 1)] * 2
    # They are the variants that steady serving traffic launches.
    g = torch.Generator().manual_seed(5)
    serving = [steady_outputs(_received(n, w, d, g), K + 1) for n, w, d in TRAFFIC]
    assert _specializations(calls) == _specializations(serving)


def test_prewarm_does_nothing_on_the_last_rank_or_without_pp():
    from deepinfer_sm80.vllm_plugin.pp_broadcast import prewarm_post_update

    runner, _, calls = _runner(is_last_rank=True)
    assert prewarm_post_update(runner) == 0
    assert prewarm_post_update(SimpleNamespace(pp_handler=None)) == 0
    # vLLM's own handler (the ledger entry not applied): nothing to warm for it.
    vllm_handler = SimpleNamespace(pp_handler=SimpleNamespace(is_last_rank=False))
    assert prewarm_post_update(vllm_handler) == 0
    assert calls == []
    no_spec, _, calls = _runner(steps=0)
    assert prewarm_post_update(no_spec) == 2
    assert all(c["sampled_tokens"].shape[1] == 1 for c in calls)


def test_steady_handler_warns_when_vllm_will_skip_the_warmup(monkeypatch, caplog):
    import vllm.config
    from vllm.v1.worker.gpu.pp_utils import PPHandler

    from deepinfer_sm80.vllm_plugin.pp_broadcast import SteadyPPHandler

    def fake_init(self, max_num_reqs, num_speculative_steps, device):
        self.is_last_rank = False

    monkeypatch.setattr(PPHandler, "__init__", fake_init)
    for jit_warmup, warned in ((True, False), (False, True)):
        config = SimpleNamespace(kernel_config=SimpleNamespace(enable_jit_warmup=jit_warmup))
        monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda c=config: c)
        caplog.clear()
        with caplog.at_level("WARNING", logger="deepinfer_sm80.pp_broadcast"):
            SteadyPPHandler(8, K, torch.device("cpu"))
        assert any("not pre-warmed" in r.message for r in caplog.records) == warned


def test_steady_handler_is_vllms_handler_with_steady_outputs(monkeypatch):
    from vllm.v1.worker.gpu.pp_utils import PPHandler

    from deepinfer_sm80.vllm_plugin.pp_broadcast import SteadyPPHandler

    assert issubclass(SteadyPPHandler, PPHandler)
    handler = SteadyPPHandler.__new__(SteadyPPHandler)
    handler.max_sample_len = K + 1
    g = torch.Generator().manual_seed(2)
    raw = _received(3, 1, False, g)
    monkeypatch.setattr(PPHandler, "get_prev_sampled_outputs", lambda self: raw)
    out = handler.get_prev_sampled_outputs()
    assert out["sampled_tokens"].shape == (3, K + 1)
    monkeypatch.setattr(PPHandler, "get_prev_sampled_outputs", lambda self: None)
    assert handler.get_prev_sampled_outputs() is None
    np.testing.assert_array_equal(out["num_rejected"].numpy(), raw["num_rejected"].numpy())
