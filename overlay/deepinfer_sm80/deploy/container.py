"""The server's container seen from the host, through the Docker SDK (``docker``).

``deepinfer health`` on the host uses it to tell a server that is still starting (its
container runs: report how far it got) from one that never will (its container exited
or restart-loops: report its exit code and last log lines at once), and to find the
host port that compose published for the server.

The SDK is imported only when a host check asks for it, so ``deploy/`` imports, and the
in-container checks run, without it.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from datetime import datetime

from deepinfer_sm80.deploy.health import HealthError

COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"
COMPOSE_ONEOFF_LABEL = "com.docker.compose.oneoff"
SERVER_PORT = 8000  # where the server listens inside the container (compose.yaml)
LOG_LINES = 20
# A restart loop's runs are at least 100 ms apart (the engine's first back-off).
RUN_LOG_MARGIN_S = 0.05

# Start-up milestones as they appear in the logs, each with how it is reported. The
# latest one found in the log tail is the stage reached; a percentage on the line
# (weight shards) is kept.
STAGES = [
    ("config-hash: ", "command rendered"),
    ("Loading safetensors checkpoint shards", "loading weights"),
    ("Loading weights took", "weights loaded"),
    ("Model loading took", "weights loaded"),
    ("Memory profiling takes", "memory profiled"),
    ("GPU KV cache size", "KV cache allocated"),
    ("Capturing CUDA graph", "capturing CUDA graphs"),
    ("Graph capturing finished", "CUDA graphs captured"),
    ("Starting vLLM API server", "starting the API server"),
    ("Application startup complete", "API server started"),
]
_PERCENT = re.compile(r"(\d{1,3})%")


class HostError(Exception):
    """The host side cannot check at all (no SDK, no engine): not a verdict on the server."""


def connect():
    """A Docker SDK client for the local engine (``DOCKER_HOST`` and friends apply)."""
    try:
        import docker
    except ImportError:
        raise HostError(
            "checking from the host needs the Docker SDK: `make cli` (installs it into "
            ".venv-cli/) or `pip install docker`"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise HostError(f"no Docker engine answers: {_first_line(exc)}") from None
    return client


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


@dataclass(frozen=True)
class ContainerRef:
    """Which container: a compose project's service, or a container name or id."""

    project: str | None = None
    service: str | None = None
    name: str | None = None

    def describe(self) -> str:
        if self.name:
            return f"container {self.name!r}"
        return f"compose service {self.service!r} of project {self.project!r}"


def find(client, ref: ContainerRef):
    """The container ``ref`` names, or None. A compose service's one-off containers
    (``compose run``) are not the server; of several replicas the newest is taken."""
    from docker.errors import DockerException, NotFound

    try:
        if ref.name:
            try:
                return client.containers.get(ref.name)
            except NotFound:
                return None
        labels = [
            f"{COMPOSE_PROJECT_LABEL}={ref.project}",
            f"{COMPOSE_SERVICE_LABEL}={ref.service}",
        ]
        found = [
            c
            for c in client.containers.list(all=True, filters={"label": labels})
            if c.labels.get(COMPOSE_ONEOFF_LABEL, "False") != "True"
        ]
    except (DockerException, OSError) as exc:  # OSError: the engine's socket went away
        raise HostError(
            f"the Docker engine failed to list containers: {_first_line(exc)}"
        ) from None
    if not found:
        return None
    return max(found, key=lambda c: c.attrs.get("Created", ""))


def detect_stage(log_text: str) -> str | None:
    """The latest start-up milestone in ``log_text``, e.g. 'loading weights (45%)'."""
    reached = None
    for line in log_text.splitlines():
        for needle, label in STAGES:
            if needle in line:
                pct = _PERCENT.search(line.split(needle, 1)[1])
                reached = f"{label} ({pct.group(1)}%)" if pct else label
    return reached


def log_tail(container, lines: int = LOG_LINES) -> str:
    """The last ``lines`` log lines of the container's latest run (a restart loop repeats
    the same lines once per run: the earlier runs are left out)."""
    from docker.errors import DockerException

    state = container.attrs.get("State", {})
    started = _timestamp(state.get("StartedAt", ""))
    finished = _timestamp(state.get("FinishedAt", ""))
    try:
        raw = b""
        if started is not None:
            # That run's window, widened a little: its first lines can be stamped just
            # before the engine records the start. The end matters when the engine has
            # restarted it again since it was inspected.
            window = {"since": started - RUN_LOG_MARGIN_S}
            if finished is not None and finished > started:
                window["until"] = finished + RUN_LOG_MARGIN_S
            raw = container.logs(tail=lines, **window)
        if not raw.strip():
            raw = container.logs(tail=lines)
    except (DockerException, OSError) as exc:  # reported in place of the logs
        return f"  (logs unavailable: {_first_line(exc)})"
    text = raw.decode(errors="replace").replace("\r", "\n")
    kept = [ln for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(f"  {ln}" for ln in kept) if kept else "  (no log output)"


def _timestamp(text: str) -> float | None:
    """A Docker timestamp (RFC 3339 with nanoseconds) as seconds since the epoch, or None."""
    if not text or text.startswith("0001-"):
        return None
    try:
        stamp = datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp.timestamp()


def _since(started: str) -> float | None:
    """Seconds since a Docker timestamp, or None."""
    stamp = _timestamp(started)
    return None if stamp is None else max(0.0, time.time() - stamp)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m"


class ServerContainer:
    """Watches the server's container across a wait: fails fast when it exited or
    restart-loops, otherwise says how far its start got."""

    def __init__(self, client, ref: ContainerRef, log_lines: int = LOG_LINES) -> None:
        self.client = client
        self.ref = ref
        self.log_lines = log_lines
        self._baseline: tuple[str, int] | None = None  # (container id, restart count)

    def current(self):
        """The container, freshly inspected; a HealthError when there is none."""
        container = find(self.client, self.ref)
        if container is None:
            hint = "" if self.ref.name else " (or name the compose project with --project)"
            raise HealthError(
                "container",
                f"no {self.ref.describe()} exists: start it with `make up`{hint}",
                final=True,
            )
        if self._baseline is None or self._baseline[0] != container.id:
            self._baseline = (container.id, int(container.attrs.get("RestartCount", 0)))
        return container

    def verdict(self, container) -> str | None:
        """Why this container will not serve (exited, restart-looping, ...), or None."""
        state = container.attrs.get("State", {})
        status = state.get("Status", "unknown")
        restarts = int(container.attrs.get("RestartCount", 0))
        code = state.get("ExitCode")
        oom = ", killed for lack of memory (OOM)" if state.get("OOMKilled") else ""
        error = f", engine error: {state['Error']}" if state.get("Error") else ""
        name = container.name
        # "created" and "removing" pass while compose (re)creates the service: not a verdict.
        if status in ("exited", "dead"):
            ended = "has exited" if status == "exited" else "is dead"
            why = f"container {name} {ended} with exit code {code}{oom}{error}"
        elif status == "restarting":
            why = (
                f"container {name} is restart-looping ({_count(restarts, 'restart')}, last "
                f"exit code {code}{oom}{error})"
            )
        elif self._baseline is not None and restarts > self._baseline[1]:
            why = (
                f"container {name} is restart-looping ({_count(restarts, 'restart')}, "
                f"{restarts - self._baseline[1]} during this check{oom}{error})"
            )
        elif status == "paused":
            return f"container {name} is paused: `docker unpause {name}`"
        else:
            return None
        return f"{why}; its last log lines:\n{log_tail(container, self.log_lines)}"

    def note(self, container) -> str:
        """How the start is going: running time and the stage the logs show."""
        state = container.attrs.get("State", {})
        up = _since(state.get("StartedAt", ""))
        parts = [f"container {container.name} {state.get('Status', 'unknown')}"]
        if up is not None:
            parts[0] += f" for {format_duration(up)}"
        health = (state.get("Health") or {}).get("Status")
        if health:
            parts.append(f"compose health {health}")
        from docker.errors import DockerException

        try:
            stage = detect_stage(container.logs(tail=200).decode(errors="replace"))
        except (DockerException, OSError):
            stage = None
        parts.append(f"stage: {stage or 'not shown in the logs yet'}")
        return ", ".join(parts)

    def url(self, container, port: int = SERVER_PORT) -> str:
        """The server's URL from the host: the port binding compose published."""
        if container.attrs.get("HostConfig", {}).get("NetworkMode") == "host":
            return f"http://127.0.0.1:{port}"
        bindings = (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(
            f"{port}/tcp"
        ) or container.attrs.get("HostConfig", {}).get("PortBindings", {}).get(f"{port}/tcp")
        if not bindings:
            raise HealthError(
                "port",
                f"container {container.name} publishes no host port for {port}/tcp: "
                "give the service a `ports:` entry, or pass --url",
            )
        binding = sorted(bindings, key=lambda b: ":" in (b.get("HostIp") or ""))[0]
        host = binding.get("HostIp") or "0.0.0.0"
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        if ":" in host:
            host = f"[{host}]"
        if not binding.get("HostPort"):
            raise HealthError("port", f"container {container.name}: {port}/tcp has no host port")
        return f"http://{host}:{binding['HostPort']}"

    def env(self, container) -> dict[str, str]:
        pairs = (container.attrs.get("Config", {}).get("Env")) or []
        return dict(p.split("=", 1) for p in pairs if "=" in p)


def host_check(server: ServerContainer, check, target, port: int = SERVER_PORT):
    """``check`` (health.check_live / check_ready) run against the container's published
    port, after making sure the container is not dead. The container is looked up again
    on every attempt, so a container that compose recreates is followed."""

    def run(t, deadline=None):
        container = server.current()
        dead = server.verdict(container)
        if dead:
            raise HealthError("container", dead, final=True)
        url = target.base_url or server.url(container, port)
        try:
            return check(dataclasses.replace(t, base_url=url), deadline)
        except HealthError as exc:
            # The container may have died while the request was out: say so instead.
            fresh = server.current()
            dead = server.verdict(fresh)
            if dead:
                raise HealthError("container", dead, final=True) from None
            raise HealthError(exc.stage, f"{exc.message} [{server.note(fresh)}]") from None

    return run
