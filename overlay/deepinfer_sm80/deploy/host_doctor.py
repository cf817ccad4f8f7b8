"""``deepinfer doctor --docker``: can this host's Docker engine run the server the way
compose.yaml asks? Checked from the host through the Docker SDK:

- the engine answers;
- NVIDIA's runtime is registered with it (``docker info``), which compose's GPU
  reservation needs;
- a short ``--gpus all`` run of the image lists at least the topology's GPU count
  (``nvidia-smi -L`` inside the container: what vLLM will see);
- in the running server container: /dev/shm and the ulimits compose sets (memlock
  unlimited, stack 64 MiB) are what the processes get, and the overlay is mounted
  read-only (what runs is the checkout).
"""

from __future__ import annotations

from deepinfer_sm80.deploy import container
from deepinfer_sm80.deploy.doctor import MIN_SHM_GIB, Check
from deepinfer_sm80.deploy.health import HealthError

OVERLAY_MOUNT = "/opt/deepinfer/overlay"
STACK_KIB = 67108864 // 1024  # compose.yaml: ulimits.stack 67108864 (bytes)
GPU_RUN_TIMEOUT_S = 60
# Printed by the one shell command run in the server container, parsed below.
_PROBE = "df -Pk /dev/shm | tail -n 1; ulimit -l; ulimit -s"


def check_engine(connect=container.connect):
    """(client or None, Check)."""
    try:
        client = connect()
    except container.HostError as exc:
        return None, Check(
            "docker-engine",
            False,
            str(exc),
            "start the engine (systemctl start docker) and check that this user may use it",
        )
    version = client.version()
    return client, Check(
        "docker-engine",
        True,
        f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')})",
    )


def check_nvidia_runtime(info: dict) -> Check:
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    ok = "nvidia" in runtimes
    return Check(
        "nvidia-runtime",
        ok,
        f"runtimes: {', '.join(runtimes) or 'none'}"
        + ("" if ok else " (no nvidia: compose's GPU reservation cannot be met)"),
        ""
        if ok
        else "install the NVIDIA Container Toolkit, run `nvidia-ctk runtime configure "
        "--runtime=docker`, restart the engine",
    )


def check_gpus_in_container(client, image: str, needed: int | None, runtime_ok: bool) -> Check:
    """``nvidia-smi -L`` in a throwaway container of ``image`` with every GPU requested."""
    if not runtime_ok:
        return Check(
            "gpus-in-container",
            True,
            "skipped: no NVIDIA runtime to give a container GPUs",
            skipped=True,
        )
    import docker
    from docker.types import DeviceRequest

    try:
        run = client.containers.run(
            image,
            entrypoint=["nvidia-smi", "-L"],
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])],
            environment={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
            detach=True,
        )
    except docker.errors.ImageNotFound:
        return Check(
            "gpus-in-container", False, f"image {image} is not here", "make image (or --image)"
        )
    except docker.errors.APIError as exc:
        return Check(
            "gpus-in-container",
            False,
            f"a --gpus container of {image} did not start: {exc.explanation or exc}",
            "check the NVIDIA Container Toolkit's setup (nvidia-ctk)",
        )
    try:
        try:
            code = run.wait(timeout=GPU_RUN_TIMEOUT_S).get("StatusCode")
        except (docker.errors.DockerException, OSError):
            return Check(
                "gpus-in-container",
                False,
                f"nvidia-smi in a container gave no answer within {GPU_RUN_TIMEOUT_S} s",
                "check the driver on the host (nvidia-smi)",
            )
        out = run.logs().decode(errors="replace")
    finally:
        run.remove(force=True)
    gpus = [ln for ln in out.splitlines() if ln.startswith("GPU ")]
    if code != 0:
        last = out.strip().splitlines()[-1] if out.strip() else "no output"
        return Check(
            "gpus-in-container",
            False,
            f"nvidia-smi -L in the container exited with {code}: {last}",
            "check the NVIDIA Container Toolkit's setup (nvidia-ctk)",
        )
    ok = needed is None or len(gpus) >= needed
    return Check(
        "gpus-in-container",
        ok,
        f"{len(gpus)} visible in a container of {image}"
        + (f" (the topology needs {needed})" if needed else ""),
        "" if ok else f"the topology needs {needed}: free GPUs or pick a smaller topology",
    )


def _skip(name: str, why: str) -> Check:
    return Check(name, True, f"skipped: {why}", skipped=True)


def check_server_container(server: container.ServerContainer) -> list[Check]:
    """/dev/shm, ulimits and the overlay mount of the running server container."""
    names = ("shm", "ulimits", "overlay-mount")
    try:
        c = server.current()
    except HealthError as exc:
        return [_skip(n, exc.message) for n in names]
    checks = [check_overlay_mount(c)]
    if c.attrs.get("State", {}).get("Status") != "running":
        why = f"container {c.name} is not running (make up starts it)"
        return [_skip("shm", why), _skip("ulimits", why), *checks]
    return [*check_limits(c), *checks]


def check_overlay_mount(c) -> Check:
    mounts = {m.get("Destination"): m for m in c.attrs.get("Mounts") or []}
    mount = mounts.get(OVERLAY_MOUNT)
    if mount is None:
        return Check(
            "overlay-mount",
            False,
            f"{OVERLAY_MOUNT} is not mounted in {c.name}: the image's copy runs, not the checkout",
            "start it with this checkout's compose.yaml (./overlay:/opt/deepinfer/overlay:ro)",
        )
    if mount.get("RW", True):
        return Check(
            "overlay-mount",
            False,
            f"{OVERLAY_MOUNT} is mounted read-write in {c.name}",
            "mount it :ro, as compose.yaml does",
        )
    return Check("overlay-mount", True, f"{mount.get('Source')} read-only at {OVERLAY_MOUNT}")


def check_limits(c) -> list[Check]:
    """What the server's processes really get: one shell command in the container."""
    import docker

    try:
        code, raw = c.exec_run(["sh", "-c", _PROBE])
    except (docker.errors.DockerException, OSError) as exc:
        why = f"cannot run a command in {c.name}: {str(exc).splitlines()[0]}"
        return [Check("shm", False, why), Check("ulimits", False, why)]
    lines = raw.decode(errors="replace").strip().splitlines()
    if code != 0:
        why = f"`sh -c` in {c.name} failed (exit {code}): {lines[0] if lines else 'no output'}"
        return [Check("shm", False, why), Check("ulimits", False, why)]
    try:
        shm_gib = int(lines[0].split()[1]) / 2**20
        memlock, stack = lines[1].strip(), lines[2].strip()
    except (IndexError, ValueError):
        why = f"unexpected answer from `{_PROBE}` in {c.name}: {lines[:3]}"
        return [Check("shm", False, why), Check("ulimits", False, why)]
    ipc = c.attrs.get("HostConfig", {}).get("IpcMode", "")
    shm = Check(
        "shm",
        shm_gib >= MIN_SHM_GIB,
        f"/dev/shm {shm_gib:.1f} GiB in {c.name} (ipc: {ipc or 'private'})",
        "" if shm_gib >= MIN_SHM_GIB else "ipc: host (compose.yaml) or shm_size: 16g",
    )
    problems = []
    if memlock != "unlimited":
        problems.append(f"memlock {memlock} KiB, not unlimited")
    if stack != str(STACK_KIB):
        problems.append(f"stack {stack} KiB, not {STACK_KIB}")
    limits = Check(
        "ulimits",
        not problems,
        "; ".join(problems) or f"memlock unlimited, stack {STACK_KIB} KiB",
        "" if not problems else "ulimits as compose.yaml sets them (memlock: -1, stack: 67108864)",
    )
    return [shm, limits]


def checks(ref: container.ContainerRef, image: str, needed: int | None, connect=None) -> list:
    client, engine = check_engine(connect or container.connect)
    if client is None:
        why = "no Docker engine"
        return [
            engine,
            _skip("nvidia-runtime", why),
            _skip("gpus-in-container", why),
            *(_skip(n, why) for n in ("shm", "ulimits", "overlay-mount")),
        ]
    runtime = check_nvidia_runtime(client.info())
    return [
        engine,
        runtime,
        check_gpus_in_container(client, image, needed, runtime.ok),
        *check_server_container(container.ServerContainer(client, ref)),
    ]
