"""Load and validate a topology file: one clear message per problem, never a traceback.

Every error names the file, the field and the fix. ``validate`` returns the problems
that forbid launching (``errors``), the ones that only forbid launching but allow a
capacity analysis (``plan_only``), and ``warnings``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from deepinfer_sm80 import model_topology
from deepinfer_sm80.deploy.schema import Topology

NUM_HEADS = 64  # attention heads (HF config num_attention_heads)
# The variable the sparse-MLA decode's split policy reads
# (ops/sparse_mla/triton_kernel.DECODE_SPLITS_ENV), spelled out here because deploy/ never
# imports torch (ARCHITECTURE.md); a test ties them.
DECODE_SPLITS_ENV = "DEEPINFER_SPARSE_MLA_DECODE_SPLITS"
MOE_INTERMEDIATE = 2304  # moe_intermediate_size
MARLIN_TILE = 128  # Marlin's MoE tile along the intermediate dimension
MAX_SPEC_TOKENS_AMPERE = 5  # DSpark blocks beyond 5 exceed Ampere shared memory
OOM_PRONE_UTILIZATION = 0.78  # above this, DSpark's first-request allocation OOMs

# configs/ sits beside overlay/ in the repository and in the image (/opt/deepinfer);
# DEEPINFER_CONFIG_DIR points elsewhere.
CONFIG_DIR = Path(
    os.environ.get("DEEPINFER_CONFIG_DIR", Path(__file__).resolve().parents[3] / "configs")
)
TOPOLOGY_DIR = CONFIG_DIR / "topologies"


class ConfigError(Exception):
    """A topology file that cannot be used; the message is meant for the user as-is."""


@dataclass
class Validation:
    topology: Topology
    path: Path
    errors: list[str] = field(default_factory=list)
    plan_only: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

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


def _where(loc: tuple) -> str:
    return ".".join(str(x) for x in loc) or "(top level)"


def load(name_or_path: str) -> tuple[Topology, Path]:
    path = resolve_path(name_or_path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}"
        )
    try:
        return Topology.model_validate(data), path
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = _where(err["loc"])
            if err["type"] == "extra_forbidden":
                lines.append(
                    f"{path}: {loc}: unknown field; check its spelling against `deepinfer schema`"
                )
            elif err["type"] == "missing":
                lines.append(f"{path}: {loc}: required field is missing")
            else:
                lines.append(f"{path}: {loc}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("\n".join(lines)) from None


def validate(
    topo: Topology,
    path: Path,
    capabilities: model_topology.PluginCapabilities | None = None,
) -> Validation:
    if capabilities is None:
        capabilities = model_topology.plugin_capabilities()
    v = Validation(topo, path)
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
    for tp in tps:
        if tp < 1 or NUM_HEADS % tp:
            v.errors.append(
                f"{path}: parallel.tensor_parallel: {tp} does not divide the "
                f"{NUM_HEADS} attention heads; use 1, 2, 4, 8, 16, 32 or 64"
            )
    if DECODE_SPLITS_ENV in topo.env:
        v.errors.append(
            f"{path}: env.{DECODE_SPLITS_ENV}: set decode_splits in the topology instead "
            "(validated, and rendered into the launch environment)"
        )
    if topo.nodes.count > 1 or topo.replicas > 1:
        from deepinfer_sm80.deploy import nodes

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
            legal = model_topology.legal_partitions(pp, capabilities)
            # The most even legal split (the fewest layers on the largest stage).
            best = min(legal, key=lambda p: (max(p), p), default=None)
            hint = f" e.g. {list(best)}" if best else ""
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
            crossing = model_topology.cross_stage(par.partition)
            if crossing and model_topology.relay_unproven(capabilities):
                cuts = model_topology.cuts_phrase(dict.fromkeys(c.cut for c in crossing))
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
    if spec.method == "dspark":
        if spec.num_speculative_tokens > MAX_SPEC_TOKENS_AMPERE:
            v.errors.append(
                f"{path}: speculative.num_speculative_tokens: "
                f"{spec.num_speculative_tokens} > {MAX_SPEC_TOKENS_AMPERE}; larger "
                "DSpark blocks exceed Ampere shared memory"
            )
        if topo.gpu_memory_utilization > OOM_PRONE_UTILIZATION:
            v.warnings.append(
                f"{path}: gpu_memory_utilization {topo.gpu_memory_utilization} > "
                f"{OOM_PRONE_UTILIZATION} with DSpark: users hit an OOM at the "
                "first request's allocation; lower it if that happens"
            )
    if not v.errors:
        from deepinfer_sm80.deploy.planner import plan  # the planner reads this module

        p = plan(topo)
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
    for tp in sorted(set(tps)):
        if (MOE_INTERMEDIATE // tp) % MARLIN_TILE:
            v.warnings.append(
                f"{path}: parallel.tensor_parallel {tp}: MoE intermediate "
                f"{MOE_INTERMEDIATE}/{tp} = {MOE_INTERMEDIATE // tp} is not a multiple "
                f"of {MARLIN_TILE}; Marlin MoE tiles run partly empty"
            )
    return v
