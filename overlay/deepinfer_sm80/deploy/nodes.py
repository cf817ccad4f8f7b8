"""Which GPUs, stages and host memory land on which node: the pure rules behind
multi-node topologies (``nodes.count > 1``) and replicated ones (``replicas > 1``).

vLLM 0.33.0 lays ranks out tensor-parallel first, node by node: stage ``s`` holds global
ranks ``s*TP .. s*TP+TP-1`` and rank ``r`` lives on node ``r // gpus_per_node``
(shared/docs/multinode-and-observability.md, section 1.2). A node boundary is therefore
a stage boundary exactly when the GPUs per node are a multiple of TP; otherwise one
stage's all-reduces cross the network in every layer.

Engram (layers 1 and 14, one table each, ~94.6 GiB FP8) lives in the pinned host memory
of the node(s) whose ranks own those layers, each TP rank holding 1/TP of the table
(same doc, section 5.1).
"""

from __future__ import annotations

from deepinfer_sm80 import model_topology as mt
from deepinfer_sm80.deploy.schema import Topology

HOST_BASE_GIB = 16  # vLLM, Python, NCCL and pinned staging buffers per node (estimate)


def world_size(topo: Topology) -> int:
    tp = topo.parallel.tensor_parallel
    tp = tp[0] if isinstance(tp, list) else tp
    return tp * topo.parallel.pipeline_parallel


def stage_nodes(topo: Topology) -> list[list[int]]:
    """For each pipeline stage, the node of each of its TP ranks."""
    tp = topo.parallel.tensor_parallel
    tp = tp[0] if isinstance(tp, list) else tp
    per_node = topo.gpus.count
    return [
        [(s * tp + r) // per_node for r in range(tp)]
        for s in range(topo.parallel.pipeline_parallel)
    ]


def layout_errors(topo: Topology) -> list[str]:
    """Why this node layout cannot be served (empty when it can)."""
    errors = []
    n = topo.nodes.count
    if n > 1 and topo.replicas > 1:
        errors.append(
            f"replicas {topo.replicas} with nodes.count {n}: a replica spans one node here; "
            "use one or the other"
        )
    if n == 1:
        return errors
    if isinstance(topo.parallel.tensor_parallel, list):
        return errors  # plan-only already (asymmetric TP)
    tp = topo.parallel.tensor_parallel
    need = world_size(topo)
    have = topo.gpus.count * n
    if need != have:
        errors.append(
            f"gpus.count {topo.gpus.count} x nodes.count {n} = {have} GPUs, but TP {tp} x "
            f"PP {topo.parallel.pipeline_parallel} needs {need}: every GPU listed must hold a "
            "rank (use fewer GPUs per node: gpus.count)"
        )
        return errors
    if topo.gpus.count % tp and tp % topo.gpus.count:
        errors.append(
            f"tensor_parallel {tp} with {topo.gpus.count} GPUs per node: a stage's TP group "
            "straddles two nodes and would all-reduce across the network in every layer; "
            f"use gpus.count a multiple of {tp}"
        )
    if topo.replicas > 1:
        errors.append("replicas > 1 needs nodes.count 1")
    return errors


def engram_host_gib(topo: Topology, table_gib: float) -> list[float]:
    """Pinned host memory for Engram tables, per node (all zero without offload)."""
    per_node = [0.0] * topo.nodes.count
    if not topo.engram_cpu_offload:
        return per_node
    ranges = mt.stage_layers(topo.parallel.partition or [mt.NUM_LAYERS])
    nodes_of = stage_nodes(topo)
    for layer in mt.ENGRAM_LAYERS:
        stage = next(i for i, r in enumerate(ranges) if layer in r)
        ranks = nodes_of[stage]
        for node in ranks:
            per_node[node] += table_gib / len(ranks)
    return per_node


def host_ram_gib(topo: Topology, table_gib: float) -> list[float]:
    return [HOST_BASE_GIB + g for g in engram_host_gib(topo, table_gib)]
