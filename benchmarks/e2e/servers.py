"""Start, wait for and stop ``vllm serve`` processes rendered by the project's launcher.

Each server is the command ``deepinfer launch`` renders for a topology file (the smoke
topology by default), with the checkpoint, port and memory share replaced, and with the
mode under test: eager or CUDA graphs, DSpark on or off, the stock path
(``DEEPINFER_DISABLE=1``: the plugin does nothing, vLLM's Hopper kernels run) or ours
(``DEEPINFER_FORCE=1``: the Ampere kernels on whatever GPU this is). Several servers share
one GPU by their ``gpu_memory_utilization``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.serving.client import Client

PATH_ENV = {"stock": {"DEEPINFER_DISABLE": "1"}, "ours": {"DEEPINFER_FORCE": "1"}}


@dataclass
class ServerSpec:
    name: str
    path: str  # "stock" or "ours"
    model_dir: str
    port: int
    eager: bool = True
    speculative: bool = False
    gpu_memory_utilization: float = 0.15
    max_num_batched_tokens: int = 8192
    topology: str = "smoke"
    gpu_kind: str = "H200"  # what the planner sizes the memory share against
    via_cli: bool = False  # start through `deepinfer launch` itself (the user's command)
    # A fixed KV pool skips vLLM's memory profiling, which reads the whole GPU's free
    # memory and so is thrown off by other servers starting on the same GPU. 6 GiB holds
    # a 1M-token sequence (about 1.8 GB of compressed KV and indexer K) several times.
    kv_cache_bytes: int | None = 6 * 2**30
    extra_env: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.path not in PATH_ENV:
            raise ValueError(f"path must be stock or ours, got {self.path!r}")


def render(spec: ServerSpec) -> tuple[list[str], dict[str, str]]:
    """The launcher's argv and environment for this server (nothing started)."""
    from deepinfer_sm80.deploy.launcher import render as render_plan
    from deepinfer_sm80.deploy.topology import load, validate

    topo, path = load(spec.topology)
    update = {
        "model": spec.model_dir,
        "port": spec.port,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "max_num_batched_tokens": spec.max_num_batched_tokens,
        "gpus": topo.gpus.model_copy(update={"kind": spec.gpu_kind}),
    }
    if not spec.speculative:
        update["speculative"] = topo.speculative.model_copy(update={"method": "none"})
    extra = []
    if spec.eager:
        extra.append("--enforce-eager")
    if spec.kv_cache_bytes:
        extra += ["--kv-cache-memory-bytes", str(spec.kv_cache_bytes)]
    update["extra_vllm_args"] = [*topo.extra_vllm_args, *extra]
    topo = topo.model_copy(update=update)
    v = validate(topo, path)
    if v.errors:
        raise ValueError(f"{spec.name}: the topology is refused: {v.errors}")
    plan = render_plan(v)
    return plan.argv, plan.env


def port_answers(port: int) -> bool:
    """Whether something already accepts connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Server:
    def __init__(self, spec: ServerSpec, log_dir: Path):
        self.spec = spec
        self.log_path = log_dir / f"{spec.name}.log"
        self.runtime_dir = log_dir / f"{spec.name}-runtime"
        self.proc: subprocess.Popen | None = None
        self.t_start = 0.0
        self.ready_s: float | None = None
        self.client = Client(f"http://127.0.0.1:{spec.port}", timeout=1800.0)
        self.served_model_name = "deepinfer-smoke"

    def start(self) -> None:
        """Start the server; refuses a port that already answers, since ``wait_ready``
        would take that other server's answers for this one's."""
        if port_answers(self.spec.port):
            raise RuntimeError(
                f"{self.spec.name}: port {self.spec.port} already answers before the server "
                "starts: another server holds it. Stop that server (or choose other ports "
                "with --port-base)"
            )
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **PATH_ENV[self.spec.path], **self.spec.extra_env}
        env["DEEPINFER_RUNTIME_DIR"] = str(self.runtime_dir)
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # skips a 2-minute JIT
        if self.spec.via_cli:
            argv = [
                "deepinfer", "launch", self.spec.topology, "--model", self.spec.model_dir,
                "--skip-preflight",
            ]  # fmt: skip
        else:
            argv, launch_env = render(self.spec)
            env.update(launch_env)
        self.argv = argv
        log = open(self.log_path, "w")  # noqa: SIM115 -- the child owns it until stop()
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, deadline_s: float) -> float:
        """Seconds from start until /v1/models answers; raises with the log's tail."""
        end = self.t_start + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.spec.name}: vllm serve exited with {self.proc.returncode}:\n"
                    + self.log_tail()
                )
            try:
                models = self.client.get_json("/v1/models")
                self.served_model_name = models["data"][0]["id"]
                self.ready_s = time.monotonic() - self.t_start
                return self.ready_s
            except Exception:  # noqa: BLE001 -- not up yet: connection refused, 503, ...
                time.sleep(2.0)
        raise TimeoutError(
            f"{self.spec.name}: not ready after {deadline_s:.0f} s:\n{self.log_tail()}"
        )

    def plugin_status(self) -> dict | None:
        """The plugin's status JSON (what it patched), if it wrote one."""
        for p in sorted(self.runtime_dir.glob("**/*.json")):
            try:
                return json.loads(p.read_text())
            except (OSError, ValueError):
                continue
        return None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
