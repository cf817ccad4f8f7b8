"""Command line: run workloads against a server, or compare two result files.

    python -m benchmarks.serving --url http://127.0.0.1:8000 --label optimized \\
        --workloads prefill_16k,prefill_64k,code_decode,spec_decode_4stream,long_generation,\\
kv_capacity --nll --out optimized.json
    python -m benchmarks.serving --compare optimized.json baseline.json [--with-original]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

from benchmarks.serving import compare, identity, nll, prompts
from benchmarks.serving.client import Client
from benchmarks.serving.workloads import (
    DEFAULT_WORKLOADS,
    PREFILL,
    Bench,
    Settings,
    validate_workloads,
)

SCHEMA = "deepinfer-sm80/serving-benchmark/1"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.serving",
        description="End-to-end serving benchmark (see benchmarks/serving/README.md).",
    )
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    ap.add_argument("--model", help="served model name (default: the first of /v1/models)")
    ap.add_argument("--api-key", help="sent as 'Authorization: Bearer <key>'")
    ap.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help="comma-separated: prefill_<N>k (N*1024 tokens), code_decode, spec_decode_4stream, "
        "long_generation, kv_capacity, nll (default: %(default)s)",
    )
    ap.add_argument("--nll", action="store_true", help="also run the prompt-NLL measurement")
    ap.add_argument("--out", type=Path, help="result JSON to write")
    ap.add_argument("--label", help="name of this server in tables (e.g. optimized, baseline)")
    ap.add_argument(
        "--patches",
        help="the DEEPINFER_PATCHES value the server was started with ('' = all ledger entries)",
    )
    ap.add_argument(
        "--plugin-status", type=Path, help="the server's plugin-status.json (actual patches)"
    )
    ap.add_argument("--server-log", type=Path, help="server log, for the 'KV cache size' line")
    s = Settings()
    ap.add_argument("--api", choices=("completions", "chat"), default=s.api)
    ap.add_argument("--repeats", type=int, default=s.repeats)
    ap.add_argument("--warmup", type=int, default=s.warmup)
    ap.add_argument("--decode-tokens", type=int, default=s.decode_tokens)
    ap.add_argument("--long-tokens", type=int, default=s.long_tokens)
    ap.add_argument("--decode-prompt-tokens", type=int, default=s.decode_prompt_tokens)
    ap.add_argument("--streams", type=int, default=s.streams)
    ap.add_argument("--temperature", type=float, default=s.temperature)
    ap.add_argument("--top-p", type=float, default=s.top_p)
    ap.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    ap.add_argument("--no-ignore-eos", action="store_true", help="let generations stop at EOS")
    ap.add_argument(
        "--extra-body",
        default="{}",
        help='JSON merged into every generation request, e.g. \'{"chat_template_kwargs": '
        '{"thinking": false}}\'',
    )
    ap.add_argument("--nll-repeats", type=int, default=s.nll_repeats)
    ap.add_argument("--timeout", type=float, default=3600.0, help="per-request timeout, s")
    ap.add_argument(
        "--compare", nargs=2, metavar=("A.json", "B.json"), help="print A vs B and exit"
    )
    ap.add_argument("--with-original", action="store_true", help="add the original's figures")
    ap.add_argument("--nll-k", type=float, default=nll.DEFAULT_K, help="verdict: |dNLL| <= k*noise")
    ap.add_argument(
        "--nll-floor",
        type=float,
        default=nll.DEFAULT_FLOOR,
        help="nats/token standing in for the noise when repeats are (nearly) identical",
    )
    ap.add_argument("--quiet", action="store_true")
    return ap


def _positive(args: argparse.Namespace) -> None:
    for name in ("repeats", "decode_tokens", "long_tokens", "decode_prompt_tokens", "streams"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        raise SystemExit("--warmup must be >= 0")
    if args.nll_repeats < 1:
        raise SystemExit("--nll-repeats must be >= 1 (>= 2 for a noise estimate)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.compare:
        a, b = (compare.load(p) for p in args.compare)
        print(
            compare.format_compare(
                a, b, with_original=args.with_original, nll_k=args.nll_k, nll_floor=args.nll_floor
            )
        )
        return 0
    _positive(args)
    try:
        extra = json.loads(args.extra_body)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--extra-body is not JSON: {exc}") from None
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if args.nll and "nll" not in workloads:
        workloads.append("nll")
    try:
        validate_workloads(workloads)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    settings = Settings(
        api=args.api,
        repeats=args.repeats,
        warmup=args.warmup,
        decode_tokens=args.decode_tokens,
        long_tokens=args.long_tokens,
        decode_prompt_tokens=args.decode_prompt_tokens,
        streams=args.streams,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        ignore_eos=not args.no_ignore_eos,
        extra_body=extra,
        nll_repeats=args.nll_repeats,
    )
    log = (lambda _msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    result = run(args, settings, workloads, log)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        log(f"wrote {args.out}")
    print(compare.format_table(result))
    return 0


def run(args: argparse.Namespace, settings: Settings, workloads: list[str], log) -> dict:
    client = Client(args.url, api_key=args.api_key, timeout=args.timeout)
    try:
        server = identity.collect(
            client,
            args.model,
            label=args.label,
            patches=args.patches,
            plugin_status=args.plugin_status,
        )
    except OSError as exc:
        raise SystemExit(
            f"cannot reach the server at {client.base_url} ({exc}); is it up (GET /health)?"
        ) from None
    log(f"server: {server['model']} (vLLM {server['version']}) at {client.base_url}")
    limit = server.get("max_model_len")
    too_long = [
        w
        for w in workloads
        if (m := PREFILL.match(w)) and int(m.group(1)) * 1024 >= (limit or 1 << 62)
    ]
    if too_long:
        raise SystemExit(
            f"{too_long} need more than the server's max_model_len {limit}: start the server "
            "with a larger --max-model-len or drop those workloads"
        )
    bench = Bench(client, server["model"], settings, log)
    stale = prompts.verify_manifest()
    server_log = args.server_log.read_text(errors="replace") if args.server_log else None
    result: dict = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "server": server,
        "client": {
            "python": platform.python_version(),
            "host": platform.node(),
            "argv": sys.argv[1:],
            "workloads": workloads,
            "settings": settings.comparable(),
            "token_fit": bench.count_source,
            "prompt_material_sha256": prompts.material_sha256(),
            "prompt_material_modified": stale,
        },
        "table": [],
        "workloads": {},
    }
    timed = [w for w in workloads if w not in ("kv_capacity", "nll")]
    if settings.warmup and timed:
        result["warmup"] = bench.warmup(workloads)
    for name in workloads:
        log(f"workload {name}")
        rows, details = bench.run(name, server_log)
        result["table"] += rows
        if name == "nll":
            result["nll"] = details
        else:
            result["workloads"][name] = details
    return result
