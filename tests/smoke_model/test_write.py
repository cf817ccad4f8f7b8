"""The tiny preset written to disk: files, formats, values and the perturbed control."""

import json

import pytest
import torch
from safetensors import safe_open

from deepinfer_sm80.smoke_model import cli, geometry, plan, tokenizer, writer

GEOMETRY = geometry.TINY


def _read(directory):
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    tensors = {}
    for filename in sorted(set(index["weight_map"].values())):
        with safe_open(str(directory / filename), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                tensors[name] = f.get_tensor(name)
    return index, tensors


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    base = tmp_path_factory.mktemp("base")
    writer.write(base, GEOMETRY, seed=3, shard_bytes=3 * 10**6, log=lambda _: None)
    perturbed = tmp_path_factory.mktemp("perturbed")
    summary = writer.write(
        perturbed,
        GEOMETRY,
        seed=3,
        perturbation=writer.Perturbation(layer=3, rel=0.01),
        shard_bytes=3 * 10**6,
        log=lambda _: None,
    )
    return base, perturbed, summary


_TORCH = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "I8": torch.int8,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
}


def test_files_match_the_plan(written):
    base, _, _ = written
    index, tensors = _read(base)
    vocab = tokenizer.ids()["vocab_size"]
    expected = plan.stored_tensors(GEOMETRY, vocab)
    assert sorted(tensors) == sorted(name for name, _, _ in expected)
    for name, shape, dt in expected:
        assert tuple(tensors[name].shape) == shape, name
        assert tensors[name].dtype == _TORCH[dt], name
    assert len(set(index["weight_map"].values())) > 1  # several shards at 3 MB each
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    assert index["metadata"]["total_size"] == total
    config = json.loads((base / "config.json").read_text())
    assert config["text_config"]["vocab_size"] == vocab
    assert config["text_config"]["compress_ratios"] == list(GEOMETRY.compress_ratios)


def test_written_values_dequantize_to_their_float_source(written):
    base, _, _ = written
    _, tensors = _read(base)
    params = {p.name: p for p in plan.params(GEOMETRY, tokenizer.ids()["vocab_size"])}
    checked = set()
    for name in (
        "layers.2.attn.wq_b",
        "layers.1.engram.embed",
        "layers.4.ffn.experts.1.w2",
        "mtp.0.main_proj",
    ):
        p = params[name]
        source = writer.float_values(p, 3, torch.device("cpu"))
        stored = [tensors[n] for n, _, _ in p.stored()]
        back = writer.dequantize(p, stored)
        step = 2.0**-4 if p.fmt.startswith("mxfp8") else 0.25
        assert back.shape == source.shape
        rel = torch.linalg.vector_norm(back - source) / torch.linalg.vector_norm(source)
        assert rel < step, (name, float(rel))
        assert rel > 0  # quantized, not copied
        checked.add(p.fmt)
    assert checked == {"mxfp8", "mxfp8_rows", "mxfp4"}
    assert torch.equal(
        tensors["layers.0.attn_norm.weight"], torch.ones(GEOMETRY.hidden_size).bfloat16()
    )
    for layer in (0, 3):
        bias = tensors[f"layers.{layer}.ffn.gate.bias"]
        chosen = {
            (layer + k) % GEOMETRY.n_routed_experts for k in range(GEOMETRY.num_experts_per_tok)
        }
        want = torch.zeros(GEOMETRY.n_routed_experts)
        want[sorted(chosen)] = plan.ROUTE_BIAS
        assert torch.equal(bias, want), (layer, bias)


def test_routing_is_decided_by_the_bias_and_branches_are_scaled():
    """The conditioning that keeps the smoke model from being chaotic (plan.py): the gate
    bias outweighs any score, and residual-branch outputs carry 1/sqrt(2 x layers)."""
    params = {p.name: p for p in plan.params(GEOMETRY, 384)}
    gate = writer.float_values(params["layers.1.ffn.gate.weight"], 0, torch.device("cpu"))
    h = torch.randn(64, GEOMETRY.hidden_size)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True))
    scores = torch.sqrt(torch.nn.functional.softplus(h @ gate.T))
    assert float(scores.max() - scores.min()) < plan.ROUTE_BIAS / 2
    gain = plan.branch_gain(GEOMETRY)
    assert gain == pytest.approx((2 * GEOMETRY.num_hidden_layers) ** -0.5)
    for name in (
        "layers.0.attn.wo_b",
        "layers.0.ffn.shared_experts.w2",
        "layers.0.ffn.experts.0.w2",
    ):
        p = params[name]
        assert p.init == ("normal", pytest.approx(gain / p.shape[1] ** 0.5)), name
    assert params["layers.0.attn.wq_b"].init[1] == pytest.approx(GEOMETRY.q_lora_rank**-0.5)


def test_values_are_deterministic_per_seed():
    p = next(p for p in plan.params(GEOMETRY, 384) if p.name == "layers.2.attn.wq_b")
    a = writer.float_values(p, 0, torch.device("cpu"))
    b = writer.float_values(p, 0, torch.device("cpu"))
    c = writer.float_values(p, 1, torch.device("cpu"))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_perturbed_checkpoint_differs_only_in_layer_attention(written):
    base, perturbed, summary = written
    _, a = _read(base)
    _, b = _read(perturbed)
    assert sorted(a) == sorted(b)
    differing = {n for n in a if not torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8))}
    assert {n.rsplit(".", 1)[0] for n in differing} == {"layers.3.attn.wq_b", "layers.3.attn.wo_b"}
    params = {p.name: p for p in plan.params(GEOMETRY, tokenizer.ids()["vocab_size"])}
    realized = summary["perturbation"]["realized"]
    assert set(realized) == {"layers.3.attn.wq_b", "layers.3.attn.wo_b"}
    for name in realized:
        p = params[name]
        old = writer.dequantize(p, [a[n] for n, _, _ in p.stored()])
        new = writer.dequantize(p, [b[n] for n, _, _ in p.stored()])
        rel = float(torch.linalg.vector_norm(new - old) / torch.linalg.vector_norm(old))
        assert rel == pytest.approx(realized[name], rel=1e-5)
        assert 0.009 <= rel <= 0.011, (name, rel)
    on_disk = json.loads((perturbed / "smoke_model.json").read_text())
    assert on_disk["perturbation"]["layer"] == 3


def test_cli_refuses_bad_input_with_exit_code_2(tmp_path, capsys):
    assert cli.main([str(tmp_path / "a"), "--preset", "tiny", "--perturb-layer", "6"]) == 2
    assert "--perturb-layer 6 is outside the backbone layers 0..5" in capsys.readouterr().err
    assert cli.main([str(tmp_path / "a"), "--perturb-rel", "0.01"]) == 2
    assert "--perturb-rel needs --perturb-layer" in capsys.readouterr().err
    code = cli.main([str(tmp_path / "a"), "--perturb-layer", "1", "--perturb-rel", "2"])
    assert code == 2
    assert "--perturb-rel 2.0 must be in (0, 0.5]" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert cli.main([str(tmp_path / "full"), "--preset", "tiny"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_cli_writes_the_tiny_preset(tmp_path, capsys):
    assert cli.main([str(tmp_path / "out"), "--preset", "tiny", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "bytes total (tiny preset, seed 0, cpu" in out
    assert (tmp_path / "out" / "tokenizer.json").exists()


def test_deepinfer_cli_dispatches_smoke_model_lazily(tmp_path, capsys):
    import subprocess
    import sys

    from deepinfer_sm80.deploy import cli as deploy_cli

    assert deploy_cli.main(["smoke-model", str(tmp_path / "x"), "--perturb-rel", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --perturb-rel needs --perturb-layer")
    probe = (
        "import sys, deepinfer_sm80.deploy.cli; print('deepinfer_sm80.smoke_model' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
