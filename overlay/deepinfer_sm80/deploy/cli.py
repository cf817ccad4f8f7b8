"""The ``deepinfer`` command: validate, launch (or --dry-run) and schema.

``launch`` runs the deploy flow once, each step on the previous one's result: load the
topology, validate it (which computes its capacity plan), render the command from the
validation, then exec it. Problems in a topology print as one message each and exit 2;
nothing prints a traceback for a user's mistake. ``launch`` exits with a code that says
who must act: 2 the configuration is refused (topology, exposure, node settings), 3 the
host cannot run it (GPUs, /dev/shm); anything else comes from vLLM itself. Compose
restarts only the last kind (README, "Restarts").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from deepinfer_sm80 import envs
from deepinfer_sm80.deploy import (
    container,
    doctor,
    exposure,
    health,
    host_doctor,
    planner,
    weights,
)
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
    if args.model:
        topo = topo.model_copy(update={"model": args.model})
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
        rank=int(args.node_rank),
        master_addr=args.master_addr or None,
        host_ip=args.host_ip,
        listen_host=args.listen_host,
    )
    try:
        plan = render(v, node)
    except ValueError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    if node.rank == 0:  # nodes > 0 run headless: no HTTP server to expose
        listening = plan.argv[plan.argv.index("--host") + 1]
        reachable_at = envs.get(exposure.PUBLISHED_ENV) or listening
        why_not = exposure.refusal(
            reachable_at, envs.get("VLLM_API_KEY"), envs.get(exposure.ALLOW_ENV)
        )
        if why_not:
            print(f"error: {path}: refused before launch: {why_not}", file=sys.stderr)
            return 2
    for what, why in plan.decisions:
        print(f"decision: {what} -- {why}", file=sys.stderr)
    env_txt = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    print(f"{env_txt} {shlex.join(plan.argv)}")
    digest = plan.config_hash()
    print(f"config-hash: {digest} (node {node.rank} of {topo.nodes.count})", file=sys.stderr)
    expected = envs.get("DEEPINFER_EXPECT_CONFIG_HASH")
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
    if not args.check:
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
    if args.check:
        print(f"{path}: checked: the launch would start vllm serve", file=sys.stderr)
        return 0
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
    if args.worker:
        try:
            pids = health.check_worker()
        except health.HealthError as exc:
            print(f"unhealthy: {exc}", file=sys.stderr)
            return 1
        print(f"worker alive (vllm pids {', '.join(map(str, pids))})")
        return 0
    check = health.check_ready if args.ready else health.check_live
    target = health.Target(
        base_url=args.url or envs.get("DEEPINFER_URL"),
        served_model_name=args.served_model_name or envs.get("DEEPINFER_SERVED_MODEL_NAME"),
        api_key=envs.get("VLLM_API_KEY"),
        timeout_s=args.timeout,
        known_answer=args.known_answer,
    )
    try:
        if args.service or args.container:
            check, target = _host_check(args, check, target)
        if args.wait:
            health.wait(check, target, args.wait, poll_s=args.poll, progress=_progress_printer())
        else:
            check(target)
    except container.HostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except health.HealthError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    print("ready" if args.ready else "live")
    return 0


def _host_check(args, check, target):
    """From the host: the check goes through the container's published port, and stops
    at once when the container has exited or restart-loops. The served name and API
    key default to the container's own settings."""
    ref = container.ContainerRef(project=args.project, service=args.service, name=args.container)
    server = container.ServerContainer(container.connect(), ref)
    env = server.env(server.current())
    target = dataclasses.replace(
        target,
        base_url=args.url or "",
        served_model_name=args.served_model_name
        or envs.get("DEEPINFER_SERVED_MODEL_NAME", env, default=target.served_model_name),
        api_key=target.api_key or envs.get("VLLM_API_KEY", env),
    )
    return container.host_check(server, check, target), target


def _progress_printer(every_s: float = 60.0):
    """Prints a waiting line when the reason changes, and at least every ``every_s``."""
    last = {"key": None, "at": -every_s}

    def progress(elapsed: float, exc: health.HealthError) -> None:
        key = re.sub(r"\d", "", str(exc))  # a new stage counts, a ticking clock does not
        if key != last["key"] or elapsed - last["at"] >= every_s:
            print(f"waiting ({elapsed:.0f} s): {exc}", file=sys.stderr, flush=True)
            last["key"], last["at"] = key, elapsed

    return progress


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds, zero or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds >= 0")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds > 0")
    return value


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
        topo, path = load(args.topology)
        needed = topo.gpus.count
    if args.docker:
        ref = container.ContainerRef(project=args.project, service=args.service)
        return _print_checks(host_doctor.checks(ref, args.image, needed), args.json)
    checks = doctor.check_gpus(doctor._nvidia_smi(), needed)
    checks += doctor.check_host(weights_dir=Path(args.weights) if args.weights else None)
    checks.append(doctor.check_patches())
    if args.expect_hash:
        if not args.topology:
            print("error: --expect-hash needs --topology", file=sys.stderr)
            return 2
        if topo.nodes.count > 1 and not args.master_addr:
            print(
                "error: --expect-hash for a multi-node topology needs node 0's address: "
                "--master-addr ADDR (or MASTER_ADDR in the environment), as the nodes use",
                file=sys.stderr,
            )
            return 2
        v = validate(topo, path)
        if v.errors:
            _report(v)
            print(f"error: {path}: refused at launch: no node renders a command", file=sys.stderr)
            return 2
        try:
            mine = render(v, NodeSettings(rank=0, master_addr=args.master_addr)).config_hash()
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        checks.append(doctor.check_config_hash(mine, args.expect_hash))
    return _print_checks(checks, args.json)


def _print_checks(checks: list[doctor.Check], as_json: bool) -> int:
    if as_json:
        print(json.dumps([c.__dict__ for c in checks], indent=1))
    else:
        for c in checks:
            fix = f"  -> {c.fix}" if c.fix else ""
            mark = "skip" if c.skipped else "ok" if c.ok else "FAIL"
            print(f"[{mark}] {c.name}: {c.detail}{fix}")
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


def cmd_gpus(args) -> int:
    """GPUs per node the topology reserves (``make up`` asks compose for this many)."""
    topo, _ = load(args.topology)
    print(topo.gpus.count)
    return 0


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
    p.add_argument("--model", help="checkpoint folder or repo id instead of the file's model")
    p.add_argument(
        "--check",
        action="store_true",
        help="validate, render and run the host preflight, then exit 0 instead of starting "
        "vLLM (compose's one-shot deepinfer-check)",
    )
    p.add_argument(
        "--skip-preflight", action="store_true", help="start even if the GPU/shm checks fail"
    )
    p.add_argument(
        "--node-rank",
        default=envs.get("NODE_RANK"),
        type=int,
        help="this node's rank in a multi-node topology (env NODE_RANK)",
    )
    p.add_argument(
        "--master-addr",
        default=envs.get("MASTER_ADDR"),
        help="node 0's address for multi-node topologies (env MASTER_ADDR)",
    )
    p.add_argument(
        "--host-ip",
        default=envs.get("VLLM_HOST_IP"),
        help="this node's address for vLLM traffic (env VLLM_HOST_IP)",
    )
    p.add_argument(
        "--listen-host",
        default=envs.get("DEEPINFER_LISTEN_HOST"),
        help="address the server listens on here, in place of the topology's host "
        "(env DEEPINFER_LISTEN_HOST; compose sets 0.0.0.0 inside the container)",
    )
    p.set_defaults(func=cmd_launch)
    p = sub.add_parser("health", help="is the server live (--live) or really ready (--ready)?")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--live", action="store_true", help="port + GET /health (default)")
    mode.add_argument("--ready", action="store_true", help="also /v1/models and one completion")
    mode.add_argument(
        "--worker", action="store_true", help="headless node: a vLLM process is alive here"
    )
    p.add_argument(
        "--url",
        help=f"the server (default: env DEEPINFER_URL, else {envs.spec('DEEPINFER_URL').default})",
    )
    p.add_argument(
        "--served-model-name",
        help="default: env DEEPINFER_SERVED_MODEL_NAME, else "
        + envs.spec("DEEPINFER_SERVED_MODEL_NAME").default,
    )
    p.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=10.0,
        help="deadline of one check, all its requests together (default 10)",
    )
    p.add_argument(
        "--wait", type=_seconds, default=0.0, help="retry until this many seconds have passed"
    )
    p.add_argument(
        "--poll", type=_positive_seconds, default=5.0, help="seconds between tries (default 5)"
    )
    host = p.add_argument_group(
        "from the host", "check through the Docker engine and the port compose publishes"
    )
    where = host.add_mutually_exclusive_group()
    where.add_argument("--service", help="the compose service's container, e.g. deepinfer")
    where.add_argument("--container", help="a container by name or id")
    host.add_argument(
        "--project",
        default=os.environ.get("COMPOSE_PROJECT_NAME") or "deepinfer",
        help="the compose project of --service (default: env COMPOSE_PROJECT_NAME, else deepinfer)",
    )
    p.add_argument(
        "--no-known-answer",
        dest="known_answer",
        action="store_false",
        help="--ready: accept any generated tokens (the smoke checkpoint's random weights)",
    )
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
    p = sub.add_parser(
        "gpus", help="print the GPUs per node a topology reserves (make up's GPU_COUNT)"
    )
    p.add_argument("topology", help="a shipped name (tp8) or a path to a YAML file")
    p.set_defaults(func=cmd_gpus)
    p = sub.add_parser("doctor", help="can this host run the server?")
    p.add_argument("--topology", help="check the GPU count against this topology")
    p.add_argument(
        "--docker",
        action="store_true",
        help="from the host, through the Docker engine: NVIDIA runtime, GPUs in a container "
        "of --image, and the --service container's /dev/shm, ulimits and overlay mount",
    )
    p.add_argument("--image", default=os.environ.get("IMAGE") or "deepinfer-sm80:0.33.0")
    p.add_argument("--service", default="deepinfer", help="with --docker (default deepinfer)")
    p.add_argument(
        "--project",
        default=os.environ.get("COMPOSE_PROJECT_NAME") or "deepinfer",
        help="with --docker: the compose project (default: env COMPOSE_PROJECT_NAME, else "
        "deepinfer)",
    )
    p.add_argument("--weights", help="checkpoint folder to verify")
    p.add_argument("--json", action="store_true")
    p.add_argument("--patches", action="store_true", help="print the patch ledger and exit")
    p.add_argument(
        "--expect-hash",
        help="node 0's config-hash (printed at its launch): check this node renders the same",
    )
    p.add_argument(
        "--master-addr",
        default=envs.get("MASTER_ADDR"),
        help="with --expect-hash: node 0's address, part of the hash (env MASTER_ADDR)",
    )
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("observability", help="render the Grafana dashboard and alert rules")
    p.add_argument("--write", required=True, metavar="DIR", help="e.g. configs/observability")
    p.set_defaults(func=cmd_observability)
    p = sub.add_parser("schema", help="print the topology JSON schema")
    p.set_defaults(func=cmd_schema)
    sub.add_parser("smoke-model", help="write a small random checkpoint (needs torch)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["smoke-model"]:  # its own parser; imports torch, so only on demand
        from deepinfer_sm80.smoke_model.cli import main as smoke_model

        return smoke_model(argv[1:], prog="deepinfer smoke-model")
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
