"""Render a validated topology into the exact ``vllm serve`` argv and environment.

A pure function: ``render`` takes what ``topology.validate`` returned (the last step of
load -> validate -> plan -> render) and returns the command, the environment additions
and every derived decision with its reason; ``launch`` in ``cli.py`` then ``exec``s it
(no shell). Secrets (the API key) travel in the environment, never in argv.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from deepinfer_sm80 import model_topology
from deepinfer_sm80.deploy import exposure
from deepinfer_sm80.deploy.planner import ENGRAM_COMPONENT
from deepinfer_sm80.deploy.topology import Validation
from deepinfer_sm80.envs import DECODE_SPLITS_ENV

# Loading the full checkpoint (checkpoint_gib_reported in the model facts: hundreds of
# GiB) takes long (vLLM recipes).
ENGINE_READY_TIMEOUT_S = 3600


# Settings that legitimately differ between the nodes of one server: excluded from the
# configuration hash, which must otherwise be identical on every node.
# The listen address is per node too: only node 0 serves HTTP, and in a container it is
# the container's side of the published port, not a property of the model's layout.
PER_NODE_FLAGS = ("--node-rank", "--data-parallel-start-rank", "--host")
PER_NODE_SWITCHES = ("--headless",)
PER_NODE_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NODE_RANK")


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    decisions: list[tuple[str, str]] = field(default_factory=list)

    def config_hash(self) -> str:
        """SHA-256 (first 16 hex digits) of the command and environment without the
        per-node parts. vLLM hangs silently when nodes disagree; printing this on every
        node (and ``deepinfer doctor --expect-hash``) makes a mismatch visible."""
        argv, skip = [], False
        for arg in self.argv:
            if skip:
                skip = False
                continue
            if arg in PER_NODE_FLAGS:
                skip = True
                continue
            if arg not in PER_NODE_SWITCHES:
                argv.append(arg)
        env = {k: v for k, v in self.env.items() if k not in PER_NODE_ENV}
        blob = json.dumps({"argv": argv, "env": env}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class NodeSettings:
    """Where this process runs in a multi-node server (from the node's .env)."""

    rank: int = 0
    master_addr: str | None = None
    host_ip: str | None = None
    # Where the API server listens here, in place of the topology's ``host``. In a
    # container it is the container's side of the published port (0.0.0.0: docker's
    # port mapping arrives on the container's own interface, not on its loopback);
    # which host address the port is published on is compose's ``ports:``.
    listen_host: str | None = None


def render(validated: Validation, node: NodeSettings | None = None) -> LaunchPlan:
    """The launch of a topology that ``validate`` accepted; ValueError for one it refused
    and for node settings that do not fit it."""
    if validated.errors:
        raise ValueError(
            f"{len(validated.errors)} validation error(s), first: {validated.errors[0]}"
        )
    topo = validated.topology
    node = node or NodeSettings()
    host = node.listen_host or topo.host
    par = topo.parallel
    tp = par.tensor_parallel
    if isinstance(tp, list):
        # One size per stage, all equal, is the symmetric layout written out; validation
        # has already made an unequal list plan-only.
        if len(set(tp)) != 1:
            raise ValueError("asymmetric tensor parallelism cannot be launched (plan-only)")
        tp = tp[0]
    decisions: list[tuple[str, str]] = []
    env: dict[str, str] = {}
    argv = [
        "vllm",
        "serve",
        topo.model,
        "--served-model-name",
        topo.served_model_name,
        "--host",
        host,
        "--port",
        str(topo.port),
        "--tensor-parallel-size",
        str(tp),
        "--pipeline-parallel-size",
        str(par.pipeline_parallel),
    ]
    if par.pipeline_parallel > 1:
        env["VLLM_PP_LAYER_PARTITION"] = ",".join(map(str, par.partition))
        decisions.append(
            (
                "VLLM_PP_LAYER_PARTITION=" + env["VLLM_PP_LAYER_PARTITION"],
                "vLLM's default even split cuts DeepSeek-V4.1's sharing groups",
            )
        )
        crossing = validated.crossing
        if crossing and validated.capabilities.relays_shared_kv:
            # Every worker's plugin must build the relay: set it for them (and in the
            # config hash, so the nodes of a multi-node server agree).
            env[model_topology.RELAY_OPT_IN_ENV] = "1"
            decisions.append(
                (
                    f"{model_topology.RELAY_OPT_IN_ENV}=1",
                    model_topology.cuts_phrase(dict.fromkeys(c.cut for c in crossing))
                    + " inside a sharing group: the plugin's pipeline relay carries its caches",
                )
            )
    argv += [
        "--max-model-len",
        str(topo.max_model_len),
        "--kv-cache-dtype",
        topo.kv_cache_dtype,
        "--gpu-memory-utilization",
        f"{topo.gpu_memory_utilization:g}",
        "--max-num-seqs",
        str(topo.max_num_seqs),
        "--max-num-batched-tokens",
        str(topo.max_num_batched_tokens),
    ]
    decisions.append(
        (
            f"--kv-cache-dtype {topo.kv_cache_dtype}",
            "vLLM maps it to fp8_ds_mla: the 584-byte V4 record on Ampere",
        )
    )
    spec = topo.speculative
    if spec.method == "dspark":
        adaptive = spec.adaptive_verification
        if adaptive and par.pipeline_parallel > 1:
            adaptive = False
            decisions.append(
                (
                    "enable_adaptive_verification=false",
                    "vLLM 0.33.0 rejects adaptive verification with PP > 1",
                )
            )
        cfg = {
            "method": "dspark",
            "num_speculative_tokens": spec.num_speculative_tokens,
            "rejection_sample_method": spec.rejection_sample_method,
            "enable_adaptive_verification": adaptive,
        }
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
        decisions.append(
            (
                f"DSpark K={spec.num_speculative_tokens}",
                "speculative decoding with DeepSeek-V4.1's draft layers",
            )
        )
    argv += [
        "--engram-config",
        json.dumps({"cpu_offload": topo.engram_cpu_offload}, separators=(",", ":")),
    ]
    if topo.engram_cpu_offload:
        engram_gib = validated.plan.components_gib[ENGRAM_COMPONENT]
        decisions.append(
            (
                "Engram tables in host memory",
                f"about {engram_gib:.0f} GiB that would otherwise take GPU memory",
            )
        )
    argv += [
        "--tokenizer-mode",
        "deepseek_v41",
        "--reasoning-parser",
        "deepseek_v41",
        "--tool-call-parser",
        "deepseek_v41",
        "--enable-auto-tool-choice",
    ]
    if not topo.vision:
        argv.append("--language-model-only")
        decisions.append(
            (
                "--language-model-only",
                "the vision encoder is not verified on Ampere (vision: false)",
            )
        )
    env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(ENGINE_READY_TIMEOUT_S)
    decisions.append(
        (
            f"VLLM_ENGINE_READY_TIMEOUT_S={ENGINE_READY_TIMEOUT_S}",
            "weight loading outlasts vLLM's default engine start timeout",
        )
    )
    if node.listen_host:
        decisions.append(
            (
                f"--host {host}",
                "the listen address given for this node (DEEPINFER_LISTEN_HOST or "
                f"--listen-host) in place of the topology's {topo.host}",
            )
        )
    elif not exposure.is_loopback(host):
        decisions.append(
            (
                f"--host {host}",
                "listening beyond loopback as configured; set VLLM_API_KEY to require a key",
            )
        )
    # Always set, so the topology, not a stray variable in a node's environment, decides.
    env[DECODE_SPLITS_ENV] = topo.decode_splits
    if topo.decode_splits != "latency":
        decisions.append(
            (
                f"{DECODE_SPLITS_ENV}={topo.decode_splits}",
                "one sparse-MLA decode split per token: faster at large batches, "
                "slower at small ones",
            )
        )
    env.update(topo.env)
    argv += topo.extra_vllm_args
    _render_nodes(topo, node, argv, env, decisions)
    return LaunchPlan(argv, env, decisions)


def _render_nodes(topo, node: NodeSettings, argv, env, decisions) -> None:
    n = topo.nodes.count
    if node.rank and n == 1:
        raise ValueError(
            f"node rank {node.rank}: topology {topo.name} runs on one node (nodes.count 1)"
        )
    if n == 1:
        return
    if not 0 <= node.rank < n:
        raise ValueError(f"node rank {node.rank}: must be 0..{n - 1} for {n} nodes")
    if topo.nodes.backend == "ray":
        if node.rank:
            raise ValueError(
                "nodes.backend ray: only the head runs `vllm serve`; other nodes join the Ray "
                "cluster (`ray start --address HEAD:6379`) instead of running deepinfer launch"
            )
        argv += ["--distributed-executor-backend", "ray"]
        decisions.append(("--distributed-executor-backend ray", "one server over a Ray cluster"))
        return
    if not node.master_addr:
        raise ValueError(
            f"{n}-node topology: MASTER_ADDR (node 0's address) is not set; put it in every "
            "node's .env or pass --master-addr"
        )
    argv += [
        "--nnodes",
        str(n),
        "--node-rank",
        str(node.rank),
        "--master-addr",
        node.master_addr,
        "--master-port",
        str(topo.nodes.master_port),
        # Each step waits on every node: give slow first steps (JIT, 1M prefill) room.
        "--distributed-timeout-seconds",
        "3600",
    ]
    if node.host_ip:
        env["VLLM_HOST_IP"] = node.host_ip
    decisions.append(
        (
            f"--nnodes {n} --node-rank {node.rank}",
            "vLLM's native multi-node mode: the same command on every node, ranks "
            "tensor-parallel first, node by node",
        )
    )
    if node.rank:
        argv.append("--headless")
        decisions.append(("--headless", "only node 0 serves HTTP and /metrics"))
