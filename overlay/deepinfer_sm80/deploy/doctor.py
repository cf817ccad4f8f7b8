"""``deepinfer doctor``: can this host run the server? Each check passes or fails with
the fix. No torch, no vLLM: the GPUs are read through ``nvidia-smi``.

Thresholds and their sources:
- driver >= 580.65.06: the minimum Linux driver for CUDA 13.0 (NVIDIA CUDA 13.0 release
  notes), which torch 2.14.0+cu130 / vLLM 0.33.0 are built against.
- host RAM >= 200 GiB with Engram offload: two Engram tables of about 94.6 GiB each
  (estimate in shared/docs/vllm-0.33-deepseek-v41.md section 5) live in pinned host memory.
- /dev/shm >= 8 GiB: NCCL and vLLM's shared-memory broadcast between workers use it;
  Docker's default of 64 MiB is far too small.
- disk >= 500 GiB free for the weights: the checkpoint is about 475 GiB (same source).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deepinfer_sm80 import envs
from deepinfer_sm80.deploy import weights
from deepinfer_sm80.deploy.config_files import model_facts
from deepinfer_sm80.deploy.nodes import HOST_BASE_GIB

MIN_DRIVER = (580, 65, 6)
MIN_SHM_GIB = 8


def checkpoint_gib() -> dict[str, float]:
    """The real checkpoint's reported sizes (``checkpoint_gib_reported`` in the model
    facts): ``backbone`` and ``engram``, in GiB."""
    return dict(model_facts("full")["checkpoint_gib_reported"])


def host_ram_needed_gib(engram_offload: bool) -> float:
    """What one node needs: the planner's per-node base, plus the Engram tables when they
    live in host memory (a one-node deployment holds both)."""
    return HOST_BASE_GIB + (checkpoint_gib()["engram"] if engram_offload else 0.0)


def weights_disk_gib() -> float:
    """Disk the downloaded checkpoint takes: backbone and Engram tables."""
    return sum(checkpoint_gib().values())


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    # Not run, for the reason in ``detail`` (another check's failure already says why).
    skipped: bool = False


NVIDIA_SMI_TIMEOUT_S = 10  # it answers in well under a second on a healthy host


def _nvidia_smi(run=subprocess.run) -> list[dict] | str:
    try:
        out = run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False,
            errors="replace",
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return (
            f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S} s (a hung driver or "
            "GPU: check `dmesg` and the driver)"
        )
    except OSError as exc:
        return f"nvidia-smi not usable ({exc.__class__.__name__})"
    if out.returncode != 0:
        return f"nvidia-smi failed: {(out.stderr.strip() or out.stdout.strip())[:300]}"
    gpus = []
    for line in out.stdout.strip().splitlines():
        fields = [x.strip() for x in line.split(",")]
        if len(fields) != 4:
            return f"nvidia-smi printed an unexpected line: {line[:120]!r}"
        name, cap, mem, drv = fields
        try:
            memory_mib = int(float(mem))
        except (ValueError, OverflowError):  # "[N/A]" on some virtualized or MIG setups
            memory_mib = None
        gpus.append({"name": name, "capability": cap, "memory_mib": memory_mib, "driver": drv})
    return gpus


def _memory(g: dict) -> str:
    return "memory unknown" if g["memory_mib"] is None else f"{g['memory_mib'] // 1024} GiB"


def check_gpus(gpus: list[dict] | str, needed: int | None = None) -> list[Check]:
    if isinstance(gpus, str) or not gpus:
        return [
            Check(
                "gpus",
                False,
                gpus or "no GPU listed",
                "install the NVIDIA driver; in Docker, the NVIDIA container toolkit and "
                "`gpus: all`",
            )
        ]
    names = ", ".join(
        f"{g['name']} (sm{g['capability'].replace('.', '')}, {_memory(g)})" for g in gpus
    )
    checks = [
        Check(
            "gpus",
            needed is None or len(gpus) >= needed,
            f"{len(gpus)} visible: {names}",
            f"the topology needs {needed}" if needed and len(gpus) < needed else "",
        )
    ]
    not_ampere = [g["name"] for g in gpus if not g["capability"].startswith("8.")]
    checks.append(
        Check(
            "ampere",
            not not_ampere,
            "all compute capability 8.x"
            if not not_ampere
            else f"not Ampere: {', '.join(not_ampere)}",
            "" if not not_ampere else "the overlay's kernels target sm80/sm86",
        )
    )
    drv = gpus[0]["driver"]
    parts = tuple(int(x) for x in drv.split(".") if x.isdigit())
    ok = parts >= MIN_DRIVER
    checks.append(
        Check(
            "driver",
            ok,
            f"{drv}" + ("" if ok else " is older than CUDA 13.0 needs"),
            "" if ok else "install driver 580.65.06 or newer",
        )
    )
    return checks


def _meminfo_gib(path: Path) -> float:
    for line in path.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    raise ValueError(f"{path}: no MemTotal line")


def check_host(
    meminfo: Path = Path("/proc/meminfo"),
    shm: Path = Path("/dev/shm"),
    weights_dir: Path | None = None,
    engram_offload: bool = True,
) -> list[Check]:
    checks = []
    ram = _meminfo_gib(meminfo)
    need = host_ram_needed_gib(engram_offload)
    checks.append(
        Check(
            "host-ram",
            ram >= need,
            f"{ram:.0f} GiB (need {need:.0f})",
            ""
            if ram >= need
            else "add memory, or turn engram_cpu_offload off (the tables then take GPU memory)",
        )
    )
    if shm.exists():
        st = os.statvfs(shm)
        gib = st.f_blocks * st.f_frsize / 2**30
        checks.append(
            Check(
                "shm",
                gib >= MIN_SHM_GIB,
                f"/dev/shm {gib:.1f} GiB",
                "" if gib >= MIN_SHM_GIB else "run with --ipc=host or shm_size: 16g",
            )
        )
    else:
        checks.append(Check("shm", False, "/dev/shm missing", "mount a tmpfs at /dev/shm"))
    if weights_dir is not None:
        problems = (
            weights.verify(weights_dir) if weights_dir.exists() else [f"{weights_dir}: absent"]
        )
        if problems and not (weights_dir / weights.INDEX_FILE).exists():
            probe = weights_dir if weights_dir.exists() else weights_dir.parent
            free = shutil.disk_usage(probe).free / 2**30 if probe.exists() else 0.0
            need_disk = weights_disk_gib()
            checks.append(
                Check(
                    "disk",
                    free >= need_disk,
                    f"{free:.0f} GiB free at {probe} (weights need ~{need_disk:.0f})",
                    "" if free >= need_disk else "free space or point the cache elsewhere",
                )
            )
        checks.append(
            Check(
                "weights",
                not problems,
                "verified" if not problems else problems[0],
                "" if not problems else "deepinfer weights download",
            )
        )
    return checks


def default_status_file() -> Path:
    """Where the plugin writes its status (vllm_plugin/apply.py uses the same rule)."""
    return Path(envs.get("DEEPINFER_RUNTIME_DIR")) / "plugin-status.json"


def check_patches(status_file: Path | None = None) -> Check:
    import json

    status_file = status_file or default_status_file()
    if not status_file.exists():
        return Check(
            "patches",
            False,
            f"no plugin status at {status_file}: vLLM has not "
            "loaded the overlay's plugin on this host yet",
            "start the server (the plugin writes it); `deepinfer doctor --patches` "
            "shows the ledger",
        )
    try:
        status = json.loads(status_file.read_text(errors="replace"))
        if not isinstance(status, dict) or not isinstance(status.get("patches", {}), dict):
            raise ValueError("not an object with a patches mapping")
    except (OSError, ValueError) as exc:
        return Check(
            "patches",
            False,
            f"plugin status {status_file} is unreadable ({str(exc)[:120]})",
            "delete it and restart the server (the plugin rewrites it at start)",
        )
    applied = [n for n, s in status.get("patches", {}).items() if str(s).startswith("applied")]
    detail = (
        f"plugin {'active' if status.get('active') else 'inactive'} "
        f"({status.get('reason')}); applied: {', '.join(applied) or 'none'}"
    )
    return Check(
        "patches",
        bool(status.get("active")),
        detail,
        "" if status.get("active") else "see the reason; DEEPINFER_FORCE=1 forces it",
    )


def check_config_hash(mine: str, expected: str) -> Check:
    """Every node of a multi-node server must render the same command and environment
    (vLLM hangs silently otherwise); node 0 prints its hash at launch."""
    ok = mine == expected.strip()
    return Check(
        "config-hash",
        ok,
        f"this node renders {mine}" + ("" if ok else f", node 0 rendered {expected.strip()}"),
        ""
        if ok
        else "make the checkout, topology file and .env identical on every node "
        "(only NODE_RANK, VLLM_HOST_IP and interface names may differ)",
    )
