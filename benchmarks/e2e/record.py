"""Correctness records that travel: one compact file per wave, merged back for ``report``.

A GPU machine can be taken back in the middle of the correctness phase, and what can be
copied off one is limited per file (16 MiB where this project's runs take place), while
``correctness.json`` holds every position's logprob as JSON text, about 6.4 MiB per probe
run of the 32 prompts. So after each wave ``correctness`` also writes that wave's servers as
``wave-<name>.npz``: the per-position logprobs and top-1 tokens as arrays, everything else
(greedy tokens, prompt hashes, server details, throughput, environment) as JSON beside
them. A wave of three servers (five probe runs of 267,457 positions) takes about 6 MiB
(``test_a_full_wave_fits_under_a_remote_machines_file_limit``).

``merge`` puts waves from several files (or several machines of the same GPU model and
stack) back into one record for ``report``. It refuses records whose GPU or versions
differ, and a server recorded twice: either would make a variation of the stock path
that is not the one its name says.

The logprobs are stored as float32 where that is exact (vLLM computes them in fp32, so
their JSON values are fp32 values) and as float64 otherwise: unpacking gives back the
record's values bit for bit.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

FORMAT = "deepinfer-e2e-wave/1"
# Fields of ``run.environment()`` two merged records must share: the GPU model and the
# stack. The host and the nvidia-smi line (driver, memory) may differ between machines.
SAME_ENVIRONMENT = ("gpu", "torch", "triton", "vllm")


def _logprob_array(values: list, where: str) -> np.ndarray:
    if any(v is None for v in values):
        raise ValueError(f"{where}: a logprob is null; a record with gaps cannot be packed")
    wide = np.asarray(values, dtype=np.float64)
    narrow = wide.astype(np.float32)
    same = (narrow.astype(np.float64) == wide) | (np.isnan(wide) & np.isnan(narrow))
    return narrow if bool(same.all()) else wide


def _token_array(values: list[int]) -> np.ndarray:
    top = max(values, default=0)
    if min(values, default=0) < 0:
        raise ValueError("token ids must be >= 0")
    return np.asarray(values, dtype=np.min_scalar_type(top))


def pack(result: dict, servers: list[str], extra: tuple[str, ...] = ()) -> bytes:
    """The ``servers`` of a phase's ``result`` (``run.phase_correctness``'s record, or
    ``phase_speculative``'s) as the bytes of one ``.npz`` file; ``extra`` names further
    top-level fields to keep whole (the speculative phase's ``health``)."""
    arrays: dict[str, np.ndarray] = {}
    runs_meta: dict[str, dict] = {}
    for server in servers:
        for schedule, run in result["runs"].get(server, {}).items():
            key = f"{server}/{schedule}"
            names = sorted(run["prompts"])
            prompts = run["prompts"]
            logprobs = [v for n in names for v in prompts[n]["logprobs"]]
            top1 = [t for n in names for t in prompts[n]["top1"]]
            arrays[f"{key}/logprobs"] = _logprob_array(logprobs, key)
            arrays[f"{key}/top1"] = _token_array(top1)
            runs_meta[key] = {
                **{k: v for k, v in run.items() if k != "prompts"},
                "prompts": {
                    n: {
                        **{k: v for k, v in prompts[n].items() if k not in ("logprobs", "top1")},
                        "positions": len(prompts[n]["logprobs"]),
                        "top1_positions": len(prompts[n]["top1"]),
                    }
                    for n in names
                },
            }
    meta = {
        "format": FORMAT,
        "phase": result.get("phase", "correctness"),
        "environment": result.get("environment", {}),
        "servers": {s: result["servers"][s] for s in servers if s in result.get("servers", {})},
        "throughput": {
            s: result["throughput"][s] for s in servers if s in result.get("throughput", {})
        },
        "runs": runs_meta,
        "extra": {k: result[k] for k in extra if k in result},
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def write(path: Path, result: dict, servers: list[str], extra: tuple[str, ...] = ()) -> int:
    """``pack`` into ``path`` (written whole, then renamed); returns its size in bytes."""
    data = pack(result, servers, extra)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(data)
    tmp.replace(path)
    return len(data)


def unpack(data: bytes | Path) -> dict:
    """A record (as ``correctness.json`` holds it) from ``pack``'s bytes or a file."""
    raw = data.read_bytes() if isinstance(data, Path) else data
    with np.load(io.BytesIO(raw)) as z:
        meta = json.loads(z["meta"].tobytes().decode())
        if meta.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file (format {meta.get('format')!r})")
        runs: dict[str, dict] = {}
        for key, run_meta in meta["runs"].items():
            server, schedule = key.rsplit("/", 1)
            logprobs = z[f"{key}/logprobs"].astype(np.float64).tolist()
            top1 = z[f"{key}/top1"].tolist()
            prompts, at, at_top = {}, 0, 0
            for name, p in run_meta["prompts"].items():
                n, m = p.pop("positions"), p.pop("top1_positions")
                prompts[name] = {
                    **p,
                    "logprobs": logprobs[at : at + n],
                    "top1": top1[at_top : at_top + m],
                }
                at, at_top = at + n, at_top + m
            if at != len(logprobs) or at_top != len(top1):
                raise ValueError(f"{key}: the arrays hold more positions than its prompts")
            runs.setdefault(server, {})[schedule] = {**run_meta, "prompts": prompts}
    return {
        "phase": meta["phase"],
        "environment": meta["environment"],
        "runs": runs,
        "servers": meta["servers"],
        "throughput": meta["throughput"],
        **meta.get("extra", {}),
    }


def load(path: Path) -> dict:
    """A record from its JSON (``correctness.json``, ``speculative.json``) or its ``.npz``
    (``wave-*.npz``, ``speculative.npz``)."""
    if path.suffix == ".npz":
        return unpack(path)
    return json.loads(path.read_text())


def check_same_environment(a: tuple[str, dict], b: tuple[str, dict]) -> None:
    """Raise unless two ``(label, record)`` pairs ran on one GPU model and one stack
    (``SAME_ENVIRONMENT``): only such records may be merged or compared run to run."""
    (label_a, rec_a), (label_b, rec_b) = a, b
    env_a, env_b = rec_a.get("environment", {}), rec_b.get("environment", {})
    for field in SAME_ENVIRONMENT:
        if env_b.get(field) != env_a.get(field):
            raise ValueError(
                f"{label_b}: environment field {field!r} is {env_b.get(field)!r}, "
                f"{label_a} has {env_a.get(field)!r}: use records of one GPU model "
                "and one stack only"
            )


def merge(records: list[tuple[str, dict]]) -> dict:
    """One record from ``(label, record)`` pairs: their runs, servers and throughput side
    by side. Refuses records of another GPU or stack (``SAME_ENVIRONMENT``) and a server
    that two records hold."""
    if not records:
        raise ValueError("merge needs at least one record")
    first_label, first = records[0]
    env = first.get("environment", {})
    merged: dict = {
        "phase": "correctness",
        "environment": dict(env),
        "runs": {},
        "servers": {},
        "throughput": {},
        "merged_from": [],
    }
    owner: dict[str, str] = {}
    for label, rec in records:
        check_same_environment((first_label, first), (label, rec))
        for server in sorted(set(rec.get("runs", {})) | set(rec.get("servers", {}))):
            if server in owner:
                raise ValueError(
                    f"server {server!r} is in both {owner[server]} and {label}: "
                    "pass one record per server"
                )
            owner[server] = label
        merged["runs"].update(rec.get("runs", {}))
        merged["servers"].update(rec.get("servers", {}))
        merged["throughput"].update(rec.get("throughput", {}))
        host = rec.get("environment", {}).get("host")
        merged["merged_from"].append({"record": label, "host": host})
    return merged


def size_mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.1f} MiB"
