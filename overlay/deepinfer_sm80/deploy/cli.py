"""The ``deepinfer`` command: validate, launch (or --dry-run) and schema.

Problems in a topology print as one message each and exit 2; nothing prints a
traceback for a user's mistake.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from deepinfer_sm80.deploy import doctor, health, planner, weights
from deepinfer_sm80.deploy.launcher import NodeSettings, render
from deepinfer_sm80.deploy.schema import Topology
from deepinfer_sm80.deploy.topology import ConfigError, load, validate


def _report(v) -> None:
    for w in v.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for e in v.errors:
        print(f"error: {e}", file=sys.stderr)


def cmd_validate(args) -> int:
    topo, path = load(args.topology)
    v = validate(topo, path)
    _report(v)
    for p in v.plan_only:
        print(f"plan-only: {p}", file=sys.stderr)
    if v.errors:
        return 2
    print(f"{path}: valid{' (plan-only: cannot be launched)' if v.plan_only else ''}")
    return 0


def cmd_launch(args) -> int:
    topo, path = load(args.topology)
    v = validate(topo, path)
    _report(v)
    if v.errors:
        print(f"error: {path}: refused before launch", file=sys.stderr)
        return 2
    if v.plan_only:
        for p in v.plan_only:
            print(f"error: {p}", file=sys.stderr)
        return 2
    node = NodeSettings(
        rank=int(args.node_rank), master_addr=args.master_addr or None, host_ip=args.host_ip
    )
    try:
        plan = render(topo, node)
    except ValueError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    for what, why in plan.decisions:
        print(f"decision: {what} -- {why}", file=sys.stderr)
    env_txt = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    print(f"{env_txt} {shlex.join(plan.argv)}")
    digest = plan.config_hash()
    print(f"config-hash: {digest} (node {node.rank} of {topo.nodes.count})", file=sys.stderr)
    expected = os.environ.get("DEEPINFER_EXPECT_CONFIG_HASH")
    if expected and expected != digest:
        print(
            f"error: config-hash {digest} differs from DEEPINFER_EXPECT_CONFIG_HASH={expected} "
            "(node 0's): the nodes would run different commands and vLLM would hang; make "
            "every node's checkout, topology and .env agree",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        return 0
    _write_runtime_file("config-hash", digest)
    if not args.skip_preflight:
        failed = [c for c in preflight(topo) if not c.ok]
        for c in failed:
            fix = f" -- fix: {c.fix}" if c.fix else ""
            print(f"error: preflight {c.name}: {c.detail}{fix}", file=sys.stderr)
        if failed:
            print(
                f"error: {path}: the host cannot run this topology; nothing was started "
                "(`deepinfer doctor --topology ...` explains; --skip-preflight starts anyway)",
                file=sys.stderr,
            )
            return 3
    exe = shutil.which(plan.argv[0])
    if exe is None:
        print(
            "error: `vllm` is not on PATH; run inside the image or install vllm==0.33.0",
            file=sys.stderr,
        )
        return 2
    os.execve(exe, plan.argv, {**os.environ, **plan.env})
    return 0  # not reached


def _write_runtime_file(name: str, text: str) -> None:
    """Best effort: `deepinfer doctor` on this node reads it back."""
    run_dir = doctor.default_status_file().parent
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text + "\n")
    except OSError as exc:
        print(f"warning: cannot write {run_dir / name}: {exc}", file=sys.stderr)


def preflight(topo: Topology) -> list[doctor.Check]:
    """What must hold before ``vllm serve`` is worth starting: enough visible Ampere GPUs
    and a usable /dev/shm. Without them vLLM fails minutes later with a traceback."""
    checks = doctor.check_gpus(doctor._nvidia_smi(), topo.gpus.count)
    checks += [c for c in doctor.check_host(engram_offload=False) if c.name == "shm"]
    return checks


def cmd_health(args) -> int:
    target = health.Target(
        base_url=args.url,
        served_model_name=args.served_model_name,
        api_key=os.environ.get("VLLM_API_KEY"),
        timeout_s=args.timeout,
    )
    if args.worker:
        try:
            pids = health.check_worker()
        except health.HealthError as exc:
            print(f"unhealthy: {exc}", file=sys.stderr)
            return 1
        print(f"worker alive (vllm pids {', '.join(map(str, pids))})")
        return 0
    check = health.check_ready if args.ready else health.check_live
    try:
        if args.wait:
            probe = health.docker_container_probe(args.container) if args.container else None
            health.wait(check, target, args.wait, container=probe)
        else:
            check(target)
    except health.HealthError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    print("ready" if args.ready else "live")
    return 0


def cmd_weights(args) -> int:
    if args.action == "download":
        try:
            path = weights.download(args.repo, args.cache_dir, args.revision)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(path)
        target = path
    else:
        target = args.path
    problems = weights.verify(target, check_hashes=args.hash)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"{target}: every shard present and complete{' (hashes checked)' if args.hash else ''}")
    return 0


def cmd_doctor(args) -> int:
    if args.patches:
        from deepinfer_sm80.vllm_plugin.ledger import format_ledger

        print(format_ledger())
        return 0
    needed = None
    if args.topology:
        topo, _ = load(args.topology)
        needed = topo.gpus.count
    checks = doctor.check_gpus(doctor._nvidia_smi(), needed)
    checks += doctor.check_host(weights_dir=Path(args.weights) if args.weights else None)
    checks.append(doctor.check_patches())
    if args.expect_hash:
        if not args.topology:
            print("error: --expect-hash needs --topology", file=sys.stderr)
            return 2
        mine = render(
            topo, NodeSettings(rank=0, master_addr=os.environ.get("MASTER_ADDR") or "unset")
        ).config_hash()
        checks.append(doctor.check_config_hash(mine, args.expect_hash))
    if args.json:
        print(json.dumps([c.__dict__ for c in checks], indent=1))
    else:
        for c in checks:
            fix = f"  -> {c.fix}" if c.fix else ""
            print(f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}{fix}")
    return 0 if all(c.ok for c in checks) else 1


def cmd_plan(args) -> int:
    if args.all:
        plans = []
        for path in planner.shipped_topologies():
            topo, _ = load(str(path))
            plans.append(planner.plan(topo, args.gpu or topo.gpus.kind))
        plans.sort(key=lambda p: -p.kv_tokens)
        if args.json:
            print(json.dumps([planner.as_dict(p) for p in plans], indent=1))
        else:
            for rank, p in enumerate(plans, 1):
                gpus = sum(s.tensor_parallel for s in p.stages)
                where = f" on {len(p.nodes)} nodes" if len(p.nodes) > 1 else ""
                if p.replicas > 1:
                    where = f" x {p.replicas} replicas"
                print(
                    f"{rank}. {p.topology:8} {gpus} x {p.gpu}{where}: {p.kv_tokens:>12,} KV "
                    f"tokens ({p.contexts_1m:.2f} x 1M){'' if p.fits else '  DOES NOT FIT'}"
                )
        return 0
    if not args.topology:
        print("error: plan needs a topology (or --all)", file=sys.stderr)
        return 2
    topo, path = load(args.topology)
    try:
        p = planner.plan(topo, args.gpu)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(planner.as_dict(p), indent=1) if args.json else planner.format_plan(p))
    return 0 if p.fits else 1


def cmd_observability(args) -> int:
    from deepinfer_sm80.deploy import observability

    for path in observability.render(Path(args.write)):
        print(f"wrote {path}")
    return 0


def cmd_schema(args) -> int:
    print(json.dumps(Topology.model_json_schema(), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deepinfer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check a topology file")
    p.add_argument("topology", help="a shipped name (tp8) or a path to a YAML file")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("launch", help="start vllm serve from a topology")
    p.add_argument("topology")
    p.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    p.add_argument(
        "--skip-preflight", action="store_true", help="start even if the GPU/shm checks fail"
    )
    p.add_argument(
        "--node-rank",
        default=os.environ.get("NODE_RANK", "0"),
        type=int,
        help="this node's rank in a multi-node topology (env NODE_RANK)",
    )
    p.add_argument(
        "--master-addr",
        default=os.environ.get("MASTER_ADDR"),
        help="node 0's address for multi-node topologies (env MASTER_ADDR)",
    )
    p.add_argument(
        "--host-ip",
        default=os.environ.get("VLLM_HOST_IP") or None,
        help="this node's address for vLLM traffic (env VLLM_HOST_IP)",
    )
    p.set_defaults(func=cmd_launch)
    p = sub.add_parser("health", help="is the server live (--live) or really ready (--ready)?")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--live", action="store_true", help="port + GET /health (default)")
    mode.add_argument("--ready", action="store_true", help="also /v1/models and one completion")
    mode.add_argument(
        "--worker", action="store_true", help="headless node: a vLLM process is alive here"
    )
    p.add_argument("--url", default=os.environ.get("DEEPINFER_URL", "http://127.0.0.1:8000"))
    p.add_argument(
        "--served-model-name",
        default=os.environ.get("DEEPINFER_SERVED_MODEL_NAME", "deepseek-v4.1-flash"),
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    p.add_argument("--wait", type=float, default=0.0, help="retry until this many seconds pass")
    p.add_argument("--container", help="with --wait: fail at once if this container exited")
    p.set_defaults(func=cmd_health)
    p = sub.add_parser("weights", help="download or verify the checkpoint")
    p.add_argument("action", choices=["download", "verify"])
    p.add_argument("path", nargs="?", help="verify: the checkpoint folder")
    p.add_argument("--repo", default="deepseek-ai/DeepSeek-V4.1-Flash")
    p.add_argument("--cache-dir", default=os.environ.get("HF_HUB_CACHE"))
    p.add_argument("--revision")
    p.add_argument("--hash", action="store_true", help="also SHA-256 every shard (slow)")
    p.set_defaults(func=cmd_weights)
    p = sub.add_parser("plan", help="weights, reserved memory and KV capacity per stage")
    p.add_argument("topology", nargs="?")
    p.add_argument("--gpu", help="GPU kind, e.g. A100-80GB, GA100-64GB, A6000")
    p.add_argument("--all", action="store_true", help="rank every shipped topology")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("doctor", help="can this host run the server?")
    p.add_argument("--topology", help="check the GPU count against this topology")
    p.add_argument("--weights", help="checkpoint folder to verify")
    p.add_argument("--json", action="store_true")
    p.add_argument("--patches", action="store_true", help="print the patch ledger and exit")
    p.add_argument(
        "--expect-hash",
        help="node 0's config-hash (printed at its launch): check this node renders the same",
    )
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("observability", help="render the Grafana dashboard and alert rules")
    p.add_argument("--write", required=True, metavar="DIR", help="e.g. configs/observability")
    p.set_defaults(func=cmd_observability)
    p = sub.add_parser("schema", help="print the topology JSON schema")
    p.set_defaults(func=cmd_schema)
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except BrokenPipeError:  # `deepinfer ... | head`: the reader left, nothing to report
        return 0


def _run(parser, args) -> int:
    if args.command == "weights" and args.action == "verify" and not args.path:
        parser.error("weights verify needs the checkpoint folder")
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
