"""Load and validate a topology file: one clear message per problem, never a traceback.

The deploy flow is load -> validate -> plan -> render, each step once: ``load`` parses
the file, ``validate`` checks it and computes its capacity plan (``planner.plan``), and
the ``Validation`` it returns carries what the launcher renders from
(``launcher.render``): the topology, the plugin capabilities it was checked against, the
pipeline cuts that cross a sharing group, and the plan.

Every error names the file, the field and the fix. ``validate`` returns the problems
that forbid launching (``errors``), the ones that only forbid launching but allow a
capacity analysis (``plan_only``), and ``warnings``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from deepinfer_sm80 import model_topology
from deepinfer_sm80.deploy import nodes, overrides, safe_yaml
from deepinfer_sm80.deploy.config_files import TOPOLOGY_DIR, ConfigError, model_facts, shown
from deepinfer_sm80.deploy.planner import Plan, min_utilization, plan
from deepinfer_sm80.deploy.schema import Topology
from deepinfer_sm80.envs import DECODE_SPLITS_ENV  # the sparse-MLA decode's split policy

MARLIN_TILE = 128  # Marlin's MoE tile along the intermediate dimension
MAX_SPEC_TOKENS_AMPERE = 5  # DSpark blocks beyond 5 exceed Ampere shared memory
OOM_PRONE_UTILIZATION = 0.78  # above this, DSpark's first-request allocation OOMs


@dataclass
class Validation:
    """A topology as validated: its problems, and what validation worked out for the
    launcher, so that nothing is computed twice."""

    topology: Topology
    path: Path
    # The plugin capabilities the partition was checked against (the relay opt-in).
    capabilities: model_topology.PluginCapabilities
    errors: list[str] = field(default_factory=list)
    plan_only: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # What the pipeline cuts make cross-stage (empty: no cut inside a sharing group).
    crossing: list[model_topology.CrossStage] = field(default_factory=list)
    # The capacity plan on the topology's GPU kind; None when the layout has errors
    # that come before planning.
    plan: Plan | None = None

    @property
    def launchable(self) -> bool:
        return not self.errors and not self.plan_only


def resolve_path(name_or_path: str) -> Path:
    """``tp8`` -> ``configs/topologies/tp8.yaml``; paths are taken as they are."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    candidate = TOPOLOGY_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = ", ".join(sorted(x.stem for x in TOPOLOGY_DIR.glob("*.yaml")))
    raise ConfigError(f"no topology named {name_or_path!r}; shipped ones: {known}")


_UNION_TAG = re.compile(r"(constrained-)?int|list\[.*\]")


def _where(loc: tuple) -> str:
    # pydantic tags each branch of a union (int | list[int]) in the location; users
    # wrote the field, not the branch.
    parts = [str(x) for x in loc if not (isinstance(x, str) and _UNION_TAG.fullmatch(x))]
    return ".".join(parts) or "(top level)"


def _relevant(errors: list[dict]) -> list[dict]:
    """Of a union's errors, those of the branch the input's type chose."""
    out, seen = [], set()
    for err in errors:
        tags = [x for x in err["loc"] if isinstance(x, str) and _UNION_TAG.fullmatch(x)]
        if tags:
            is_list = (
                isinstance(err.get("input"), list)
                or len(err["loc"]) > err["loc"].index(tags[-1]) + 1
            )
            if is_list != tags[-1].startswith("list"):
                continue
        key = (_where(err["loc"]), err["msg"])
        if key not in seen:
            seen.add(key)
            out.append(err)
    return out or errors[:1]


def load(name_or_path: str) -> tuple[Topology, Path]:
    path = resolve_path(name_or_path)
    try:
        data = safe_yaml.load(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}"
        )
    try:
        return Topology.model_validate(data), path
    except ValidationError as exc:
        lines = []
        for err in _relevant(exc.errors()):
            loc = _where(err["loc"])
            if err["type"] == "extra_forbidden":
                lines.append(
                    f"{path}: {loc}: unknown field; check its spelling against `deepinfer schema`"
                )
            elif err["type"] == "missing":
                lines.append(f"{path}: {loc}: required field is missing")
            else:
                msg = err["msg"].removeprefix("Value error, ")
                lines.append(f"{path}: {loc}: {msg} (got {shown(err.get('input'))})")
        raise ConfigError("\n".join(lines)) from None


def _dspark_oom_warning(topo: Topology, path: Path, needed: float) -> str:
    """The first-request OOM risk, stated with what this layout needs to fit at all."""
    u = topo.gpu_memory_utilization
    head = (
        f"{path}: gpu_memory_utilization {u:g} > {OOM_PRONE_UTILIZATION} with DSpark: users "
        "report an OOM at the first request above it (DSpark allocates its buffers then, "
        "after vLLM sized the KV cache; their size is not measured here)"
    )
    if needed <= OOM_PRONE_UTILIZATION:
        return f"{head}; this layout fits from {needed:.2f}: use {OOM_PRONE_UTILIZATION} or less"
    return (
        f"{head}; this layout needs at least {needed:.2f} to hold max_model_len "
        f"{topo.max_model_len:,} (`deepinfer plan`), so both cannot hold: if the first request "
        "OOMs, shorten max_model_len, add GPUs or set speculative.method: none"
    )


def validate(
    topo: Topology,
    path: Path,
    capabilities: model_topology.PluginCapabilities | None = None,
) -> Validation:
    if capabilities is None:
        capabilities = model_topology.plugin_capabilities()
    v = Validation(topo, path, capabilities)
    facts = model_facts(topo.checkpoint)
    v.errors += overrides.errors(topo, path)
    if topo.max_model_len > facts["max_position_embeddings"]:
        v.errors.append(
            f"{path}: max_model_len: {topo.max_model_len:,} exceeds the model's "
            f"{facts['max_position_embeddings']:,} positions (max_position_embeddings); "
            "lower it"
        )
    if topo.parallel.pipeline_parallel > facts["num_hidden_layers"]:
        v.errors.append(
            f"{path}: parallel.pipeline_parallel: {topo.parallel.pipeline_parallel} stages "
            f"for {facts['num_hidden_layers']} layers; each stage needs one layer at least"
        )
        return v
    if model_topology.RELAY_OPT_IN_ENV in topo.env:
        v.errors.append(
            f"{path}: env.{model_topology.RELAY_OPT_IN_ENV}: the relay opt-in is read by "
            "`deepinfer` itself when it validates the partition; set it in the environment "
            "(or .env for docker compose), not in the topology file"
        )
    par = topo.parallel
    pp = par.pipeline_parallel
    tps = (
        par.tensor_parallel if isinstance(par.tensor_parallel, list) else [par.tensor_parallel] * pp
    )
    if isinstance(par.tensor_parallel, list) and len(par.tensor_parallel) != pp:
        v.errors.append(
            f"{path}: parallel.tensor_parallel: {len(par.tensor_parallel)} sizes for "
            f"{pp} stages; give one per stage or a single number"
        )
        return v
    heads = facts["num_attention_heads"]
    for tp in tps:
        if tp < 1 or heads % tp:
            divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
            v.errors.append(
                f"{path}: parallel.tensor_parallel: {tp} does not divide the "
                f"{heads} attention heads; use one of {divisors}"
            )
    if DECODE_SPLITS_ENV in topo.env:
        v.errors.append(
            f"{path}: env.{DECODE_SPLITS_ENV}: set decode_splits in the topology instead "
            "(validated, and rendered into the launch environment)"
        )
    if topo.nodes.count > 1 or topo.replicas > 1:
        problems = nodes.layout_errors(topo)
        v.errors += [f"{path}: nodes: {e}" for e in problems]
        if problems:
            return v
        if topo.nodes.count > 1 and tps[0] > topo.gpus.count:
            v.warnings.append(
                f"{path}: tensor_parallel {tps[0]} spans nodes ({topo.gpus.count} GPUs each): "
                "every layer all-reduces across the network; use InfiniBand/RoCE"
            )
        if topo.nodes.count > 1 and topo.nodes.backend == "ray":
            v.warnings.append(
                f"{path}: nodes.backend ray: start the Ray cluster first and add `ray` to the "
                "image (vLLM 0.33.0 does not install it)"
            )
    if topo.nodes.count == 1 and sum(tps) != topo.gpus.count:
        layout = "+".join(map(str, tps))
        v.errors.append(
            f"{path}: gpus.count: {topo.gpus.count} GPUs, but the layout uses "
            f"{sum(tps)} ({layout}); make them agree"
        )
    if pp > 1:
        if par.partition is None:
            best = model_topology.most_even_partition(pp, capabilities)
            hint = f" e.g. {list(best)}" if best else " no legal split has that many stages"
            v.errors.append(
                f"{path}: parallel.partition: required with {pp} pipeline stages "
                f"(vLLM's even split cuts sharing groups);{hint}"
            )
        elif len(par.partition) != pp:
            v.errors.append(
                f"{path}: parallel.partition: {len(par.partition)} entries for {pp} "
                "stages; give one layer count per stage"
            )
        else:
            for problem in model_topology.partition_errors(par.partition, capabilities):
                v.errors.append(f"{path}: parallel.partition {par.partition}: {problem}")
            v.crossing = model_topology.cross_stage(par.partition)
            if v.crossing and model_topology.relay_unproven(capabilities):
                cuts = model_topology.cuts_phrase(dict.fromkeys(c.cut for c in v.crossing))
                v.warnings.append(
                    f"{path}: parallel.partition {par.partition}: for {cuts} the pipeline "
                    f"relay ({model_topology.RELAY_OPT_IN_ENV}=1) carries the shared caches; "
                    "it is tested on CPU against vLLM 0.33.0 but has not run on GPUs (the "
                    "end-to-end check is in overlay/deepinfer_sm80/vllm_plugin/pp_relay/"
                    "README.md)"
                )
    elif par.partition is not None and par.partition != [model_topology.NUM_LAYERS]:
        v.errors.append(f"{path}: parallel.partition: set only with pipeline_parallel > 1")
    if len(set(tps)) > 1:
        v.plan_only.append(
            f"{path}: parallel.tensor_parallel {tps}: vLLM 0.33.0 runs one TP size "
            "for all stages; this layout is for capacity analysis only"
        )
    spec = topo.speculative
    if spec.method == "dspark" and spec.num_speculative_tokens > MAX_SPEC_TOKENS_AMPERE:
        v.errors.append(
            f"{path}: speculative.num_speculative_tokens: "
            f"{spec.num_speculative_tokens} > {MAX_SPEC_TOKENS_AMPERE}; larger "
            "DSpark blocks exceed Ampere shared memory"
        )
    if not v.errors:
        v.plan = p = plan(topo, facts=facts)
        if spec.method == "dspark" and topo.gpu_memory_utilization > OOM_PRONE_UTILIZATION:
            v.warnings.append(_dspark_oom_warning(topo, path, min_utilization(topo, p=p)))
        if not p.fits:
            worst = min(p.stages, key=lambda s: s.kv_budget_gib)
            v.errors.append(
                f"{path}: does not fit {topo.gpus.count} x {p.gpu}: stage {worst.stage} (layers "
                f"{worst.layers}) has {worst.weights_gib:.1f} GiB of weights and "
                f"{worst.reserved_gib:.1f} GiB reserved per GPU, leaving "
                f"{worst.kv_budget_gib:.1f} GiB for KV ({p.kv_tokens:,} tokens < max_model_len "
                f"{topo.max_model_len:,}); raise gpu_memory_utilization, add GPUs or shorten "
                "max_model_len (see `deepinfer plan`)"
            )
    moe = model_topology.MOE_INTERMEDIATE_SIZE
    for tp in sorted(set(tps)):
        if (moe // tp) % MARLIN_TILE:
            v.warnings.append(
                f"{path}: parallel.tensor_parallel {tp}: MoE intermediate "
                f"{moe}/{tp} = {moe // tp} is not a multiple "
                f"of {MARLIN_TILE}; Marlin MoE tiles run partly empty"
            )
    return v
