"""`deepinfer health` from the host: the Docker SDK side, against fakes of the SDK's
client and containers (fast; the image tier runs the same against real containers)."""

import subprocess
import sys

import docker  # requirements/host.txt pins it: missing, this file fails
import pytest

from deepinfer_sm80.deploy import cli, container, health
from tests.deploy.test_health import start_fake_vllm

PROJECT, SERVICE = "deepinfer", "deepinfer"


class FakeContainer:
    def __init__(self, name="deepinfer-deepinfer-1", status="running", exit_code=0,
                 restarts=0, logs="", ports=None, oneoff=False, created="2026-01-01T00:00:00Z",
                 started="", env=(), network="deepinfer_default", oom=False):  # fmt: skip
        self.name, self.id = name, f"id-{name}"
        self.labels = {
            container.COMPOSE_PROJECT_LABEL: PROJECT,
            container.COMPOSE_SERVICE_LABEL: SERVICE,
            container.COMPOSE_ONEOFF_LABEL: "True" if oneoff else "False",
        }
        self._logs = logs
        self.log_windows = []
        self.attrs = {
            "Created": created,
            "RestartCount": restarts,
            "State": {"Status": status, "ExitCode": exit_code, "OOMKilled": oom,
                      "Error": "", "StartedAt": started},
            "Config": {"Env": list(env)},
            "HostConfig": {"NetworkMode": network, "PortBindings": {}},
            "NetworkSettings": {"Ports": ports or {}},
        }  # fmt: skip

    def logs(self, tail="all", since=None, until=None):
        self.log_windows.append((since, until))
        lines = self._logs.splitlines(keepends=True)
        return "".join(lines[-tail:] if tail != "all" else lines).encode()


class FakeContainers:
    def __init__(self, items):
        self.items = items
        self.list_calls = []

    def list(self, all=False, filters=None):  # the SDK's argument name
        assert all is True, "a stopped container must be found too"
        self.list_calls.append(filters)
        want = dict(x.split("=", 1) for x in filters["label"])
        return [c for c in self.items if want.items() <= c.labels.items()]

    def get(self, name):
        for c in self.items:
            if name in (c.name, c.id):
                return c
        raise docker.errors.NotFound(f"No such container: {name}")


class FakeClient:
    def __init__(self, *items):
        self.containers = FakeContainers(list(items))


def _server(*items, ref=None):
    ref = ref or container.ContainerRef(project=PROJECT, service=SERVICE)
    return container.ServerContainer(FakeClient(*items), ref, log_lines=3)


def test_find_takes_the_service_container_not_one_off_runs():
    server = FakeContainer(created="2026-01-01T00:00:00Z")
    oneoff = FakeContainer(name="deepinfer-deepinfer-run-1", oneoff=True, created="2026-02-01")
    client = FakeClient(oneoff, server)
    ref = container.ContainerRef(project=PROJECT, service=SERVICE)
    assert container.find(client, ref) is server
    assert client.containers.list_calls == [
        {"label": ["com.docker.compose.project=deepinfer", "com.docker.compose.service=deepinfer"]}
    ]
    assert container.find(client, container.ContainerRef(project="other", service=SERVICE)) is None
    assert container.find(client, container.ContainerRef(name="deepinfer-deepinfer-1")) is server
    assert container.find(client, container.ContainerRef(name="nope")) is None


def test_missing_container_is_final_and_names_the_project():
    with pytest.raises(health.HealthError) as info:
        _server().current()
    assert info.value.final
    assert str(info.value) == (
        "container: no compose service 'deepinfer' of project 'deepinfer' exists: start it "
        "with `make up` (or name the compose project with --project)"
    )


LOGS = "one\ntwo\nerror: preflight gpus: no GPU listed -- fix: install the driver\n"


def test_verdict_exited_gives_code_and_last_lines():
    c = FakeContainer(status="exited", exit_code=3, logs=LOGS)
    server = _server(c)
    assert server.verdict(server.current()) == (
        "container deepinfer-deepinfer-1 has exited with exit code 3; its last log lines:\n"
        "  one\n  two\n  error: preflight gpus: no GPU listed -- fix: install the driver"
    )


def test_verdict_restart_loop_by_state_and_by_rising_count():
    c = FakeContainer(status="restarting", exit_code=2, restarts=4, logs="x\n", oom=True)
    server = _server(c)
    assert server.verdict(server.current()) == (
        "container deepinfer-deepinfer-1 is restart-looping (4 restarts, last exit code 2, "
        "killed for lack of memory (OOM)); its last log lines:\n  x"
    )
    # Running again, but it restarted since the check began: a loop caught between runs.
    c = FakeContainer(status="running", restarts=1, logs="y\n")
    server = _server(c)
    assert server.verdict(server.current()) is None  # an old restart is not a loop
    c.attrs["RestartCount"] = 3
    assert server.verdict(server.current()) == (
        "container deepinfer-deepinfer-1 is restart-looping (3 restarts, 2 during this "
        "check); its last log lines:\n  y"
    )


def test_log_tail_reads_the_latest_run_only():
    """A restart loop repeats its lines every run: the window is the run inspected."""
    c = FakeContainer(status="restarting", logs="x\n")
    c.attrs["State"]["StartedAt"] = "2026-01-01T00:00:10.5000000Z"
    c.attrs["State"]["FinishedAt"] = "2026-01-01T00:00:11.25Z"
    container.log_tail(c, 5)
    since, until = c.log_windows[0]
    assert since == pytest.approx(1767225610.5 - container.RUN_LOG_MARGIN_S)
    assert until == pytest.approx(1767225611.25 + container.RUN_LOG_MARGIN_S)
    c.attrs["State"]["FinishedAt"] = "0001-01-01T00:00:00Z"  # running: no end yet
    container.log_tail(c, 5)
    assert c.log_windows[1][1] is None


def test_verdict_created_removing_paused_dead():
    for passing in ("created", "removing"):  # compose (re)creating the service
        server = _server(FakeContainer(status=passing))
        assert server.verdict(server.current()) is None
    server = _server(FakeContainer(status="dead", exit_code=137, logs="z\n"))
    assert server.verdict(server.current()) == (
        "container deepinfer-deepinfer-1 is dead with exit code 137; its last log lines:\n  z"
    )
    server = _server(FakeContainer(status="restarting", exit_code=1, restarts=1))
    assert "(1 restart, last exit code 1)" in server.verdict(server.current())
    server = _server(FakeContainer(status="paused"))
    assert "is paused: `docker unpause deepinfer-deepinfer-1`" in server.verdict(server.current())


@pytest.mark.parametrize(
    "log,stage",
    [
        ("", None),
        ("decision: x\nconfig-hash: abc (node 0 of 1)\n", "command rendered"),
        (
            "config-hash: abc\nLoading safetensors checkpoint shards:  45% Completed | 29/64\n",
            "loading weights (45%)",
        ),
        (
            "Loading safetensors checkpoint shards: 100%\nModel loading took 80 GiB\n",
            "weights loaded",
        ),
        (
            "Memory profiling takes 300 s\nGPU KV cache size: 3,655,785 tokens\n",
            "KV cache allocated",
        ),
        ("Starting vLLM API server 0 on http://0.0.0.0:8000\n", "starting the API server"),
    ],
)
def test_detect_stage(log, stage):
    assert container.detect_stage(log) == stage


def test_note_says_how_far_the_start_got():
    c = FakeContainer(logs="Loading safetensors checkpoint shards:  7% Completed\n")
    c.attrs["State"]["Health"] = {"Status": "starting"}
    server = _server(c)
    assert server.note(server.current()) == (
        "container deepinfer-deepinfer-1 running, compose health starting, "
        "stage: loading weights (7%)"
    )


@pytest.mark.parametrize(
    "ports,network,url",
    [
        ({"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8000"}]}, "bridge",
         "http://127.0.0.1:8000"),
        ({"8000/tcp": [{"HostIp": "::", "HostPort": "18000"},
                       {"HostIp": "0.0.0.0", "HostPort": "18000"}]}, "bridge",
         "http://127.0.0.1:18000"),
        ({"8000/tcp": [{"HostIp": "::", "HostPort": "18000"}]}, "bridge", "http://[::1]:18000"),
        ({}, "host", "http://127.0.0.1:8000"),
    ],
)  # fmt: skip
def test_url_from_the_published_port(ports, network, url):
    c = FakeContainer(ports=ports, network=network)
    assert _server(c).url(c) == url


def test_url_without_a_published_port():
    c = FakeContainer()
    with pytest.raises(health.HealthError) as info:
        _server(c).url(c)
    assert str(info.value) == (
        "port: container deepinfer-deepinfer-1 publishes no host port for 8000/tcp: give the "
        "service a `ports:` entry, or pass --url"
    )


@pytest.fixture
def vllm():
    srv = start_fake_vllm()
    yield srv
    srv.shutdown()
    srv.server_close()


def _published(srv):
    return {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(srv.server_address[1])}]}


def test_cli_on_the_host_ready_through_the_published_port(vllm, monkeypatch, capsys):
    vllm.api_key = "sk-in-container"
    c = FakeContainer(ports=_published(vllm), env=["VLLM_API_KEY=sk-in-container"])
    monkeypatch.setattr(container, "connect", lambda: FakeClient(c))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert cli.main(["health", "--ready", "--service", SERVICE]) == 0
    assert capsys.readouterr().out == "ready\n"


def test_cli_on_the_host_fails_fast_on_an_exited_container(monkeypatch, capsys):
    c = FakeContainer(status="exited", exit_code=2, logs="error: tp2-pp3: refused before launch\n")
    monkeypatch.setattr(container, "connect", lambda: FakeClient(c))
    assert cli.main(["health", "--ready", "--service", SERVICE, "--wait", "600"]) == 1
    assert capsys.readouterr().err == (
        "unhealthy: container: container deepinfer-deepinfer-1 has exited with exit code 2; "
        "its last log lines:\n  error: tp2-pp3: refused before launch\n"
    )


def test_cli_on_the_host_reports_progress_while_starting(monkeypatch, capsys):
    """Nothing listens on the published port yet: each try says how far the start got."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = FakeContainer(
        ports={"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]},
        logs="config-hash: abc\n",
    )
    monkeypatch.setattr(container, "connect", lambda: FakeClient(c))
    argv = ["health", "--service", SERVICE, "--wait", "0.5", "--poll", "0.2"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    note = "[container deepinfer-deepinfer-1 running, stage: command rendered]"
    assert err[0] == (
        f"waiting (0 s): port: 127.0.0.1:{port} does not accept connections "
        f"(connection refused) {note}"
    )
    assert err[-1].startswith(
        f"unhealthy: port: 127.0.0.1:{port} does not accept connections (connection refused) "
        f"{note} (still failing after waiting 0."
    )


def test_cli_without_the_sdk_says_how_to_get_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "docker", None)  # makes `import docker` fail
    assert cli.main(["health", "--service", SERVICE]) == 2
    assert capsys.readouterr().err == (
        "error: checking from the host needs the Docker SDK: `make cli` (installs it into "
        ".venv-cli/) or `pip install docker`\n"
    )


def test_cli_without_an_engine(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert cli.main(["health", "--service", SERVICE]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no Docker engine answers: ") and "Traceback" not in err


def test_deploy_imports_without_the_sdk():
    code = (
        "import sys; sys.modules['docker'] = None\n"
        "import deepinfer_sm80.deploy.cli, deepinfer_sm80.deploy.container\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout == "ok\n", out.stderr
