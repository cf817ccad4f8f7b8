"""``deepinfer plan``: per stage and GPU, weights, reserved memory and KV capacity.

Estimates, derived from the model facts in ``configs/model/deepseek-v4.1-flash.yaml``
(every formula is below, with its assumptions):

- weights per stage: its decoder layers (routed experts MXFP4, shared expert and
  attention MXFP8, all tensor-parallel) plus the embedding on the first stage and the
  LM head and the 3 DSpark layers on the last (BF16 / as the backbone);
- reserved per GPU: CUDA graphs and activations (``RESERVED_GIB``) plus, on stages that
  hold ratio-1 layers (20-39), the bf16 prefill gather workspace vLLM reserves at the
  maximum context (4 requests x (1M + 128 + batched tokens) x 512 x 2 B);
- KV bytes per token on a stage: each kv source it holds (or mirrors, for stages whose
  layers read layer 20 across a cut) costs 584/ratio bytes of compressed KV plus
  132/ratio bytes of indexer K, replicated on every TP rank (one latent KV head);
- vLLM sizes one block count for all stages, so the tightest stage bounds the pool.

Against the original's tp2-pp3 figure (4,648,480 tokens on six 64 GB GPUs) this plan gives
3,655,785 at utilization 0.92, a ratio of 0.786. The bound is stage 1 (layers 14-27): 48.2
GiB of weights, 3 GiB fixed reserve plus 4.0 GiB prefill gather workspace (it holds ratio-1
layers), and 1,074 B/token (layer 14's records at ratio 2, layer 20's at ratio 1). The
original's tokens at that rate are 4.65 GiB of KV against 3.66 GiB here: one GiB apart,
which one GiB less reserve or weights, or utilization 0.936, would close. None of those
terms is measured (vLLM profiles the reserve at start; the attention parameter count is
an estimate; the original does not state its utilization or reserve), so the plan does not
tune one of them to land within 10% of the figure: a GPU run's "KV cache size" line is
what settles it. ``plan`` prints this comparison for tp2-pp3 on GA100-64GB.

DSpark allocates its buffers at the first request, after vLLM sized the KV cache; users
report an OOM above utilization 0.78 (``topology.OOM_PRONE_UTILIZATION``). Their size has
not been measured on a GPU here, so validation states both bounds: ``min_utilization``
(the least utilization at which every stage holds ``max_model_len``) and 0.78. tp2-pp3
and pp6 on 64 GB GPUs need about 0.88 and 0.90, so both cannot hold there; the shipped
files keep 0.92 (below 0.88 the 1M context does not fit) and the warning says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.deploy import gpu_kinds
from deepinfer_sm80.deploy import nodes as nodes_mod
from deepinfer_sm80.deploy.config_files import CONFIG_DIR, model_facts
from deepinfer_sm80.deploy.schema import Topology

GIB = 2**30
RESERVED_GIB = 3.0  # CUDA graphs + activations per GPU (est; vLLM profiles it at start)
PREFILL_CHUNK_REQUESTS = 4  # vLLM's PREFILL_CHUNK_SIZE for DeepSeek-V4.1 attention
ORIGINAL_TP2_PP3_TOKENS = 4_648_480  # the original's GA100-64GB TP2 x PP3 figure
# Stages holding a layer from here on (the ratio-1 layers, 20-39) reserve the bf16 prefill
# gather workspace.
FIRST_RATIO_1_LAYER = mt.COMPRESS_RATIOS.index(1)

GPU_MEMORY_GIB = gpu_kinds.MEMORY_GIB


# The components_gib entry of the Engram tables (the launcher quotes it).
ENGRAM_COMPONENT = "Engram tables (host memory when offloaded, reported)"


def layer_weight_bytes(f: dict, routed: int | None = None) -> float:
    """One decoder layer: routed + shared experts, attention (all tensor-parallel)."""
    b = f["bytes_per_param"]
    expert = 3 * f["hidden_size"] * f["moe"]["moe_intermediate_size"]
    routed = f["moe"]["n_routed_experts"] if routed is None else routed
    return (
        routed * expert * b["mxfp4"]
        + f["n_shared_experts"] * expert * b["mxfp8"]
        + f["attention_params_per_layer"] * b["mxfp8"]
    )


def component_bytes(f: dict) -> dict[str, float]:
    """Weight bytes per component and dtype, for the table's breakdown (estimates)."""
    b = f["bytes_per_param"]
    expert = 3 * f["hidden_size"] * f["moe"]["moe_intermediate_size"]
    embed = f["vocab_size"] * f["hidden_size"] * b["bf16"]
    layers = f["num_hidden_layers"]
    return {
        "routed experts (MXFP4 + UE8M0), all layers": layers
        * f["moe"]["n_routed_experts"]
        * expert
        * b["mxfp4"],
        "shared experts (MXFP8 + UE8M0), all layers": layers
        * f["n_shared_experts"]
        * expert
        * b["mxfp8"],
        "attention + indexer (MXFP8 + UE8M0), all layers": layers
        * f["attention_params_per_layer"]
        * b["mxfp8"],
        "embedding (BF16)": embed,
        "LM head (BF16)": embed,
        "DSpark layers (3)": f["dspark_layers"]
        * layer_weight_bytes(f, f["dspark_moe"]["n_routed_experts"]),
        ENGRAM_COMPONENT: f["checkpoint_gib_reported"]["engram"] * GIB,
    }


def kv_bytes_per_token(f: dict, layers: range, mirrored_sources: set[int]) -> float:
    """Compressed KV + indexer K per token for the kv sources a stage holds or mirrors."""
    per = f["kv_bytes_per_token"]
    held = {s for s in mt.KV_SOURCES if s in layers} | mirrored_sources
    return sum((per["v4_record"] + per["indexer_k_fp8"]) / mt.COMPRESS_RATIOS[s] for s in held)


@dataclass
class StagePlan:
    stage: int
    layers: str
    tensor_parallel: int
    weights_gib: float
    reserved_gib: float
    kv_budget_gib: float
    kv_bytes_per_token: float
    kv_tokens: int


@dataclass
class Plan:
    topology: str
    gpu: str
    gpu_memory_gib: float
    stages: list[StagePlan]
    kv_tokens: int
    contexts_1m: float
    host_ram_gib: float  # the busiest node
    fits: bool
    notes: list[str]
    components_gib: dict[str, float]
    nodes: list[dict] = field(default_factory=list)  # per node: GPUs, stages, host RAM
    replicas: int = 1  # independent copies; kv_tokens is per replica
    # Pipeline relay: extra bytes per token each cut carries (first layer of the next
    # stage -> bytes), on top of the hidden_states + pre_mix payload every cut carries.
    relay_bytes_per_token: dict[int, int] = field(default_factory=dict)


def plan(topo: Topology, gpu: str | None = None, facts: dict | None = None) -> Plan:
    """The plan of ``topo`` on ``gpu`` (default: the topology's GPU kind). ``facts``: the
    model facts of ``topo.checkpoint`` when the caller has loaded them already."""
    f = facts if facts is not None else model_facts(topo.checkpoint)
    kind = gpu_kinds.canonical(gpu or topo.gpus.kind)
    if kind is None:
        raise ValueError(f"--gpu: {gpu_kinds.unknown_message(gpu)}")
    gpu = kind
    mem = GPU_MEMORY_GIB[gpu]
    par = topo.parallel
    pp = par.pipeline_parallel
    tps = (
        par.tensor_parallel if isinstance(par.tensor_parallel, list) else [par.tensor_parallel] * pp
    )
    partition = par.partition or [mt.NUM_LAYERS]
    ranges = mt.stage_layers(partition)
    embed = f["vocab_size"] * f["hidden_size"] * f["bytes_per_param"]["bf16"]
    dspark = f["dspark_layers"] * layer_weight_bytes(f, f["dspark_moe"]["n_routed_experts"])
    stages = []
    for i, (layers, tp) in enumerate(zip(ranges, tps, strict=True)):
        w = len(layers) * layer_weight_bytes(f)
        if i == 0:
            w += embed
        if i == len(ranges) - 1:
            w += embed + dspark
        w /= tp
        reserved = RESERVED_GIB * GIB
        if any(x >= FIRST_RATIO_1_LAYER for x in layers):
            reserved += (
                PREFILL_CHUNK_REQUESTS
                * (topo.max_model_len + 128 + topo.max_num_batched_tokens)
                * mt.HEAD_DIM
                * 2
            )
        mirrored = {
            s
            for s in mt.KV_SOURCES
            for g in mt.SHARING_GROUPS
            if g.source == s and s < layers.start <= g.last
        }
        per_token = kv_bytes_per_token(f, layers, mirrored)
        budget = topo.gpu_memory_utilization * mem * GIB - w - reserved
        tokens = int(max(budget, 0) // per_token) if per_token else 0
        stages.append(
            StagePlan(
                i,
                f"{layers.start}-{layers.stop - 1}",
                tp,
                w / GIB,
                reserved / GIB,
                budget / GIB,
                per_token,
                tokens,
            )
        )
    kv_tokens = min(s.kv_tokens for s in stages)
    table_gib = f["checkpoint_gib_reported"]["engram"] / len(mt.ENGRAM_LAYERS)
    host_per_node = nodes_mod.host_ram_gib(topo, table_gib)
    host = max(host_per_node)
    stage_nodes = nodes_mod.stage_nodes(topo) if not isinstance(par.tensor_parallel, list) else []
    node_rows = [
        {
            "node": n,
            "gpus": topo.gpus.count,
            "stages": sorted({s for s, ns in enumerate(stage_nodes) if n in ns}),
            "host_ram_gib": round(host_per_node[n], 1),
        }
        for n in range(topo.nodes.count)
    ]
    notes = [
        "estimates: weights from layer shapes and dtypes, reserved memory a fixed "
        f"{RESERVED_GIB:g} GiB per GPU plus the prefill gather workspace; vLLM measures "
        "both at start, so its figure will differ by a few percent",
        "the tightest stage bounds the pool: vLLM uses one block count for all stages",
    ]
    if topo.name == "tp2-pp3" and gpu == "GA100-64GB":
        notes.append(_against_the_original(topo, stages, kv_tokens, mem))
    fits = all(s.kv_budget_gib > 0 for s in stages) and kv_tokens >= topo.max_model_len
    components = {k: v / GIB for k, v in component_bytes(f).items()}
    return Plan(
        topo.name,
        gpu,
        mem,
        stages,
        kv_tokens,
        kv_tokens / 1_048_576,
        host,
        fits,
        notes,
        components,
        node_rows,
        topo.replicas,
        mt.relay_bytes_per_token(partition),
    )


def _against_the_original(topo: Topology, stages: list[StagePlan], tokens: int, mem) -> str:
    """Where this plan and the original's tp2-pp3 figure part: the original's tokens,
    priced at the bounding stage's bytes per token, as GiB of KV budget."""
    worst = min(stages, key=lambda s: s.kv_tokens)
    need_gib = ORIGINAL_TP2_PP3_TOKENS * worst.kv_bytes_per_token / GIB
    gap = need_gib - worst.kv_budget_gib
    fixed = RESERVED_GIB
    workspace = worst.reserved_gib - fixed
    return (
        f"the original reported {ORIGINAL_TP2_PP3_TOKENS:,} KV tokens here; this plan gives "
        f"{tokens:,} (ratio {tokens / ORIGINAL_TP2_PP3_TOKENS:.3f}) at gpu_memory_utilization "
        f"{topo.gpu_memory_utilization:g}. At stage {worst.stage}'s "
        f"{worst.kv_bytes_per_token:.0f} B/token the original's figure is {need_gib:.2f} GiB "
        f"of KV against {worst.kv_budget_gib:.2f} GiB here: {gap:.2f} GiB apart, as much as "
        f"utilization {topo.gpu_memory_utilization + gap / mem:.3f}. The terms that can "
        f"differ are the ones not measured: the fixed {fixed:g} GiB for CUDA graphs and "
        f"activations (vLLM profiles it at start), the {workspace:.1f} GiB bf16 prefill "
        "gather workspace at this context length, and the weight estimate (the attention "
        "parameter count is an estimate). The original states neither its utilization nor "
        "its reserved memory, so the plan keeps its estimates rather than fit one of them "
        "to the figure"
    )


def min_utilization(topo: Topology, gpu: str | None = None, p: Plan | None = None) -> float:
    """The smallest gpu_memory_utilization at which every stage holds ``max_model_len``
    tokens of KV (the same estimates as ``plan``): budget = u * memory - weights - reserved
    must reach max_model_len * bytes per token on every stage. ``p``: the plan of ``topo``
    on ``gpu`` when the caller has it already."""
    p = p if p is not None else plan(topo, gpu)
    mem = p.gpu_memory_gib * GIB
    return max(
        (s.weights_gib * GIB + s.reserved_gib * GIB + topo.max_model_len * s.kv_bytes_per_token)
        / mem
        for s in p.stages
    )


def format_plan(p: Plan) -> str:
    lines = [
        f"{p.topology} on {p.gpu} ({p.gpu_memory_gib} GiB each)",
        f"{'stage':>5} {'layers':>7} {'TP':>3} {'weights':>9} {'reserved':>9} "
        f"{'KV budget':>10} {'B/token':>8} {'KV tokens':>11}",
    ]
    for s in p.stages:
        lines.append(
            f"{s.stage:>5} {s.layers:>7} {s.tensor_parallel:>3} {s.weights_gib:>8.1f}G "
            f"{s.reserved_gib:>8.1f}G {s.kv_budget_gib:>9.1f}G {s.kv_bytes_per_token:>8.0f} "
            f"{s.kv_tokens:>11,}"
        )
    lines.append(
        f"KV pool: {p.kv_tokens:,} tokens = {p.contexts_1m:.2f} contexts of 1M; "
        f"host RAM needed ~{p.host_ram_gib:.0f} GiB; {'fits' if p.fits else 'DOES NOT FIT'}"
    )
    if len(p.nodes) > 1:
        for n in p.nodes:
            stages = ", ".join(map(str, n["stages"])) or "none"
            lines.append(
                f"node {n['node']}: {n['gpus']} GPUs, stages {stages}, host RAM "
                f"~{n['host_ram_gib']:.0f} GiB (Engram tables of the layers it holds)"
            )
    if p.relay_bytes_per_token:
        lines.append(
            "pipeline payload per token at each cut: "
            + "; ".join(
                f"layer {cut}: {mt.BASELINE_PP_BYTES_PER_TOKEN:,} B + relay {extra:,} B"
                for cut, extra in p.relay_bytes_per_token.items()
            )
        )
    lines.append(
        "weights by component (whole model, before TP/PP): "
        + "; ".join(f"{k} {v:.1f} GiB" for k, v in p.components_gib.items())
    )
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def as_dict(p: Plan) -> dict:
    return asdict(p)


def shipped_topologies() -> list[Path]:
    return sorted((CONFIG_DIR / "topologies").glob("*.yaml"))
