"""Every tensor of the checkpoint, described without allocating it.

Names follow the DeepSeek-V4.1 checkpoint layout that vLLM 0.33.0 maps
(``_make_deepseek_v4_vl_weights_mapper``): ``embed``/``head``/``norm`` at the top,
``layers.{i}.*`` for the 40 backbone layers and ``mtp.{k}.*`` for the DSpark
draft stages. A quantized weight ``X`` is stored as ``X.weight`` (codes) plus
``X.scale`` (UE8M0 exponents); vLLM renames ``.scale`` per quantization method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .geometry import QUANT_BLOCK, Geometry, engram_num_embeddings

# safetensors dtype names of the stored tensors
F8 = "F8_E4M3"
E8M0 = "F8_E8M0"
I8 = "I8"
BF16 = "BF16"
F32 = "F32"
DTYPE_BYTES = {F8: 1, E8M0: 1, I8: 1, BF16: 2, F32: 4}


@dataclass(frozen=True)
class Param:
    """One logical tensor and how it is stored.

    fmt: ``mxfp8`` (32 x 32 blocks), ``mxfp8_rows`` (1 x 32 blocks), ``mxfp4``,
    ``bf16`` or ``fp32``. init: ``("normal", std)``, ``("const", value)``,
    ``("hc_base", hc_mult)``, ``("hc_scale", value)`` or ``("route", first, count,
    bias)`` (a gate bias that favours experts first .. first+count-1, modulo their number).
    """

    name: str
    shape: tuple[int, ...]
    fmt: str
    init: tuple
    layer: int | None = None  # backbone layer index (None: not in a backbone layer)
    attention: bool = False

    @property
    def quantized(self) -> bool:
        return self.fmt.startswith("mxfp")

    def stored(self) -> list[tuple[str, tuple[int, ...], str]]:
        if not self.quantized:
            return [(self.name, self.shape, BF16 if self.fmt == "bf16" else F32)]
        out, inp = self.shape
        if self.fmt == "mxfp8":
            return [
                (f"{self.name}.weight", (out, inp), F8),
                (f"{self.name}.scale", (math.ceil(out / QUANT_BLOCK), inp // QUANT_BLOCK), E8M0),
            ]
        if self.fmt == "mxfp8_rows":
            return [
                (f"{self.name}.weight", (out, inp), F8),
                (f"{self.name}.scale", (out, inp // QUANT_BLOCK), E8M0),
            ]
        return [
            (f"{self.name}.weight", (out, inp // 2), I8),
            (f"{self.name}.scale", (out, inp // QUANT_BLOCK), E8M0),
        ]

    def nbytes(self) -> int:
        return sum(math.prod(shape) * DTYPE_BYTES[dt] for _, shape, dt in self.stored())


# Why the smoke checkpoint is conditioned, not just random. With every weight at
# N(0, 1/fan_in), a 40-layer DeepSeek-V4.1 is chaotic: a bf16 rounding difference (a
# batch of 16 instead of 1) flips an MoE routing decision or an fp8 activation code, and
# after 40 layers the stock path disagrees with itself on the top-1 token at 70% of the
# positions (benchmarks/results/e2e). Such a model cannot tell a wrong kernel from
# rounding. Two changes make it ordered, as trained models are:
# - every residual branch's output projection is scaled by 1/sqrt(2 x layers), so a
#   perturbation shrinks layer over layer instead of growing;
# - each MoE gate's bias (vLLM's e_score_correction_bias, used only to choose experts)
#   favours ``num_experts_per_tok`` experts by ROUTE_BIAS, far above the spread of the
#   scores, so routing never flips on rounding; which experts rotates with the layer,
#   so every expert still runs somewhere. The gate's scores still weight the experts.
ROUTE_BIAS = 8.0


def branch_gain(g: Geometry) -> float:
    return 1.0 / math.sqrt(2 * g.num_hidden_layers)


def _linear(name, out, inp, fmt="mxfp8", gain=1.0, **kw) -> Param:
    """Weights ~ N(0, gain^2/fan_in); an unquantized one is stored as ``name.weight``."""
    stored_name = name if fmt.startswith("mxfp") else f"{name}.weight"
    return Param(stored_name, (out, inp), fmt, ("normal", gain / math.sqrt(inp)), **kw)


def _norm(name, dim, **kw) -> Param:
    return Param(name, (dim,), "bf16", ("const", 1.0), **kw)


def _attention(g: Geometry, p: str, layer: int, backbone: int | None) -> list[Param]:
    h, hd = g.hidden_size, g.head_dim
    kw = {"layer": backbone, "attention": True}
    params = [
        _linear(f"{p}.attn.wq_a", g.q_lora_rank, h, **kw),
        _linear(f"{p}.attn.wkv", hd, h, **kw),
        _norm(f"{p}.attn.q_norm.weight", g.q_lora_rank, **kw),
        _linear(f"{p}.attn.wq_b", g.num_attention_heads * hd, g.q_lora_rank, **kw),
        _norm(f"{p}.attn.kv_norm.weight", hd, **kw),
        _linear(
            f"{p}.attn.wo_a",
            g.o_groups * g.o_lora_rank,
            g.num_attention_heads * hd // g.o_groups,
            **kw,
        ),
        _linear(f"{p}.attn.wo_b", h, g.o_groups * g.o_lora_rank, gain=branch_gain(g), **kw),
        Param(f"{p}.attn.attn_sink", (g.num_attention_heads,), "fp32", ("normal", 0.1), **kw),
    ]
    if g.is_kv_source(layer):
        # Unquantized in vLLM (quant_config=None); ratio 1 pools single tokens
        # and carries no gate.
        params.append(_linear(f"{p}.attn.compressor.wkv", hd, h, "bf16", **kw))
        if g.compress_ratio(layer) > 1:
            params.append(_linear(f"{p}.attn.compressor.wgate", hd, h, "bf16", **kw))
        params.append(_norm(f"{p}.attn.compressor.norm.weight", hd, **kw))
    if g.is_index_source(layer):
        nh, ihd = g.index_n_heads, g.index_head_dim
        params.append(_linear(f"{p}.attn.indexer.wq_b", nh * ihd, g.q_lora_rank, **kw))
        params.append(_linear(f"{p}.attn.indexer.weights_proj", nh, h, "bf16", **kw))
        if g.is_kv_source(layer):
            params.append(_linear(f"{p}.attn.indexer.wk", ihd, hd, "bf16", **kw))
            params.append(_norm(f"{p}.attn.indexer.k_norm.weight", ihd, **kw))
    return params


def _ffn(g: Geometry, p: str, layer: int, backbone: int | None) -> list[Param]:
    h, inter = g.hidden_size, g.moe_intermediate_size
    draft = layer >= g.num_hidden_layers
    experts = g.dspark_n_routed_experts if draft else g.n_routed_experts
    kw = {"layer": backbone}
    params = [
        Param(f"{p}.ffn.gate.weight", (experts, h), "bf16", ("normal", 1.0 / math.sqrt(h)), **kw),
        Param(
            f"{p}.ffn.gate.bias",
            (experts,),
            "fp32",
            (
                "route",
                layer,
                g.dspark_num_experts_per_tok if draft else g.num_experts_per_tok,
                ROUTE_BIAS,
            ),
            **kw,
        ),
        # Vision checkpoints route image tokens with their own bias on every MoE layer.
        Param(f"{p}.ffn.gate.bias_vl", (experts,), "fp32", ("const", 0.0), **kw),
    ]
    shared = inter * g.n_shared_experts
    params += [
        _linear(f"{p}.ffn.shared_experts.w1", shared, h, **kw),
        _linear(f"{p}.ffn.shared_experts.w3", shared, h, **kw),
        _linear(f"{p}.ffn.shared_experts.w2", h, shared, gain=branch_gain(g), **kw),
    ]
    for j in range(experts):
        params += [
            _linear(f"{p}.ffn.experts.{j}.w1", inter, h, "mxfp4", **kw),
            _linear(f"{p}.ffn.experts.{j}.w3", inter, h, "mxfp4", **kw),
            _linear(f"{p}.ffn.experts.{j}.w2", h, inter, "mxfp4", gain=branch_gain(g), **kw),
        ]
    return params


def _mhc(g: Geometry, p: str, backbone: int | None) -> list[Param]:
    mix = (2 + g.hc_mult) * g.hc_mult
    width = g.hc_mult * g.hidden_size
    params = []
    for part in ("attn", "ffn"):
        params += [
            # unit-variance mixes before the per-group scale: sigmoid/softmax stay unsaturated
            Param(
                f"{p}.hc_{part}_fn",
                (mix, width),
                "fp32",
                ("normal", 1.0 / math.sqrt(width)),
                backbone,
            ),
            Param(f"{p}.hc_{part}_base", (mix,), "fp32", ("hc_base", g.hc_mult), backbone),
            Param(f"{p}.hc_{part}_scale", (3,), "fp32", ("hc_scale", 0.1), backbone),
        ]
    return params


def _engram(g: Geometry, p: str, layer: int) -> list[Param]:
    slot = g.engram_layer_ids.index(layer)
    rows = engram_num_embeddings(g)[slot]
    cols = (g.engram_max_ngram_size - 1) * g.engram_n_heads * g.engram_head_dim
    return [
        Param(f"{p}.engram.embed", (rows, g.engram_head_dim), "mxfp8_rows", ("normal", 1.0), layer),
        _linear(f"{p}.engram.wkv", g.hidden_size * (g.hc_mult + 1), cols, layer=layer),
        Param(f"{p}.engram.q_weight", (g.hc_mult, g.hidden_size), "bf16", ("const", 1.0), layer),
        Param(f"{p}.engram.k_weight", (g.hc_mult, g.hidden_size), "bf16", ("const", 1.0), layer),
    ]


def _decoder_layer(g: Geometry, p: str, layer: int) -> list[Param]:
    backbone = layer if layer < g.num_hidden_layers else None
    params = []
    if layer in g.engram_layer_ids and backbone is not None:
        params += _engram(g, p, layer)
    params += _attention(g, p, layer, backbone)
    params += _ffn(g, p, layer, backbone)
    params += [_norm(f"{p}.attn_norm.weight", g.hidden_size, layer=backbone)]
    params += [_norm(f"{p}.ffn_norm.weight", g.hidden_size, layer=backbone)]
    params += _mhc(g, p, backbone)
    return params


def params(g: Geometry, vocab_size: int) -> list[Param]:
    """The checkpoint, in file order."""
    h = g.hidden_size
    out = [Param("embed.weight", (vocab_size, h), "bf16", ("normal", 1.0))]
    for layer in range(g.num_hidden_layers):
        out += _decoder_layer(g, f"layers.{layer}", layer)
    out += [
        _norm("norm.weight", h),
        Param("head.weight", (vocab_size, h), "bf16", ("normal", 1.0 / math.sqrt(h))),
    ]
    for k in range(g.dspark_layers):
        p = f"mtp.{k}"
        if k == 0:
            # the context combiner over the target's aux hidden states
            out.append(_linear(f"{p}.main_proj", h, h * len(g.dspark_target_layer_ids)))
            out.append(_norm(f"{p}.main_norm.weight", h))
        out += _decoder_layer(g, p, g.num_hidden_layers + k)
        if k == g.dspark_layers - 1:
            r = g.dspark_markov_rank
            out += [
                _norm(f"{p}.norm.weight", h),
                Param(f"{p}.markov_head.embed.weight", (vocab_size, r), "bf16", ("normal", 1.0)),
                Param(
                    f"{p}.markov_head.head.weight",
                    (vocab_size, r),
                    "bf16",
                    ("normal", 1.0 / math.sqrt(r)),
                ),
                Param(
                    f"{p}.confidence_head.proj.weight",
                    (1, h + r),
                    "fp32",
                    ("normal", 1.0 / math.sqrt(h + r)),
                ),
            ]
    return out


def stored_tensors(g: Geometry, vocab_size: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [t for p in params(g, vocab_size) for t in p.stored()]


def shards(plan: list[Param], shard_bytes: int) -> list[list[Param]]:
    """Consecutive groups of about ``shard_bytes`` each (a tensor never splits)."""
    groups: list[list[Param]] = [[]]
    size = 0
    for p in plan:
        if groups[-1] and size + p.nbytes() > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.nbytes()
    return groups
