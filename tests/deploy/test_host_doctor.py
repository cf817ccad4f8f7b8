"""`deepinfer doctor --docker` against fakes of the Docker SDK (fast)."""

import docker  # requirements/host.txt pins it: missing, this file fails
import pytest

from deepinfer_sm80.deploy import cli, container, host_doctor
from deepinfer_sm80.deploy.doctor import Check
from tests.deploy.test_container import FakeClient, FakeContainer

IMAGE = "deepinfer-sm80:0.33.0"
NVIDIA_SMI_L = "".join(f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: GPU-{i})\n" for i in range(8))


class FakeRun:
    def __init__(self, code, out, hang=False):
        self.code, self.out, self.hang, self.removed = code, out, hang, False

    def wait(self, timeout=None):
        if self.hang:
            raise docker.errors.DockerException("read timed out")
        return {"StatusCode": self.code}

    def logs(self):
        return self.out.encode()

    def remove(self, force=False):
        self.removed = force


class DoctorClient(FakeClient):
    def __init__(self, *items, runtimes=("runc", "nvidia"), run=None, run_error=None):
        super().__init__(*items)
        self._runtimes, self._run, self._run_error = runtimes, run, run_error
        self.containers.run = self.run
        self.run_calls = []

    def version(self):
        return {"Version": "28.2.2", "ApiVersion": "1.50"}

    def info(self):
        return {"Runtimes": {r: {} for r in self._runtimes}}

    def run(self, image, **kw):
        self.run_calls.append((image, kw))
        if self._run_error:
            raise self._run_error
        return self._run


class ServerContainer(FakeContainer):
    """A running service container whose `sh -c` probe prints ``probe``."""

    def __init__(self, probe, mounts=None, **kw):
        super().__init__(**kw)
        self.probe = probe
        self.attrs["HostConfig"]["IpcMode"] = "host"
        self.attrs["Mounts"] = (
            mounts
            if mounts is not None
            else [{"Source": "/src/overlay", "Destination": "/opt/deepinfer/overlay", "RW": False}]
        )

    def exec_run(self, cmd):
        assert cmd == ["sh", "-c", host_doctor._PROBE]
        return 0, self.probe.encode()


GOOD_PROBE = "tmpfs 65929100 0 65929100 0% /dev/shm\nunlimited\n65536\n"
REF = container.ContainerRef(project="deepinfer", service="deepinfer")


def _run(client, needed=6):
    return host_doctor.checks(REF, IMAGE, needed, connect=lambda: client)


def test_all_good():
    run = FakeRun(0, NVIDIA_SMI_L)
    client = DoctorClient(ServerContainer(GOOD_PROBE), run=run)
    checks = _run(client)
    assert checks == [
        Check("docker-engine", True, "Docker 28.2.2 (API 1.50)"),
        Check("nvidia-runtime", True, "runtimes: nvidia, runc"),
        Check("gpus-in-container", True,
              "8 visible in a container of deepinfer-sm80:0.33.0 (the topology needs 6)"),
        Check("shm", True, "/dev/shm 62.9 GiB in deepinfer-deepinfer-1 (ipc: host)"),
        Check("ulimits", True, "memlock unlimited, stack 65536 KiB"),
        Check("overlay-mount", True, "/src/overlay read-only at /opt/deepinfer/overlay"),
    ]  # fmt: skip
    image, kw = client.run_calls[0]
    assert image == IMAGE and kw["entrypoint"] == ["nvidia-smi", "-L"]
    assert kw["device_requests"][0]["Count"] == -1 and run.removed


def test_no_nvidia_runtime_skips_the_gpu_run():
    client = DoctorClient(ServerContainer(GOOD_PROBE), runtimes=("runc",))
    runtime, gpus = _run(client)[1:3]
    assert not runtime.ok and runtime.detail == (
        "runtimes: runc (no nvidia: compose's GPU reservation cannot be met)"
    )
    assert gpus.skipped and gpus.ok
    assert gpus.detail == "skipped: no NVIDIA runtime to give a container GPUs"
    assert client.run_calls == []


@pytest.mark.parametrize(
    "run,error,detail",
    [
        (FakeRun(0, NVIDIA_SMI_L[: NVIDIA_SMI_L.index("GPU 4")]), None,
         "4 visible in a container of deepinfer-sm80:0.33.0 (the topology needs 6)"),
        (FakeRun(9, "Failed to initialize NVML: Unknown Error\n"), None,
         "nvidia-smi -L in the container exited with 9: Failed to initialize NVML: Unknown Error"),
        (FakeRun(0, "", hang=True), None,
         "nvidia-smi in a container gave no answer within 60 s"),
        (None, docker.errors.ImageNotFound("no such image"),
         "image deepinfer-sm80:0.33.0 is not here"),
    ],
)  # fmt: skip
def test_gpu_run_failures(run, error, detail):
    client = DoctorClient(ServerContainer(GOOD_PROBE), run=run, run_error=error)
    gpus = _run(client)[2]
    assert not gpus.ok and gpus.detail == detail
    if run is not None:
        assert run.removed


def test_small_shm_and_wrong_ulimits():
    probe = "shm 65536 0 65536 0% /dev/shm\n8192\n8192\n"
    shm, limits = _run(DoctorClient(ServerContainer(probe), run=FakeRun(0, NVIDIA_SMI_L)))[3:5]
    assert shm == Check(
        "shm", False, "/dev/shm 0.1 GiB in deepinfer-deepinfer-1 (ipc: host)",
        "ipc: host (compose.yaml) or shm_size: 16g",
    )  # fmt: skip
    assert limits == Check(
        "ulimits", False, "memlock 8192 KiB, not unlimited; stack 8192 KiB, not 65536",
        "ulimits as compose.yaml sets them (memlock: -1, stack: 67108864)",
    )  # fmt: skip


def test_limits_probe_that_cannot_run():
    c = ServerContainer("")
    c.exec_run = lambda cmd: (126, b'OCI runtime exec failed: exec: "sh": not found\n')
    shm, limits = _run(DoctorClient(c, run=FakeRun(0, NVIDIA_SMI_L)))[3:5]
    why = (
        "`sh -c` in deepinfer-deepinfer-1 failed (exit 126): OCI runtime exec failed: exec: "
        '"sh": not found'
    )
    assert shm == Check("shm", False, why) and limits == Check("ulimits", False, why)


@pytest.mark.parametrize(
    "mounts,detail",
    [
        ([{"Source": "/src/overlay", "Destination": "/opt/deepinfer/overlay", "RW": True}],
         "/opt/deepinfer/overlay is mounted read-write in deepinfer-deepinfer-1"),
        ([], "/opt/deepinfer/overlay is not mounted in deepinfer-deepinfer-1: the image's copy "
             "runs, not the checkout"),
    ],
)  # fmt: skip
def test_overlay_mount(mounts, detail):
    c = ServerContainer(GOOD_PROBE, mounts=mounts)
    mount = _run(DoctorClient(c, run=FakeRun(0, NVIDIA_SMI_L)))[5]
    assert not mount.ok and mount.detail == detail


def test_stopped_or_missing_server_container_skips_its_checks():
    c = ServerContainer(GOOD_PROBE, status="exited")
    shm, limits, mount = _run(DoctorClient(c, run=FakeRun(0, NVIDIA_SMI_L)))[3:]
    why = "skipped: container deepinfer-deepinfer-1 is not running (make up starts it)"
    assert shm.skipped and shm.detail == why and limits.detail == why
    assert mount.ok and not mount.skipped  # the mount is known without running
    missing = _run(DoctorClient(run=FakeRun(0, NVIDIA_SMI_L)))[3:]
    assert all(c.skipped for c in missing)
    assert missing[0].detail.startswith("skipped: no compose service 'deepinfer'")


def test_cli_doctor_docker_output_and_exit_code(monkeypatch, capsys):
    client = DoctorClient(ServerContainer(GOOD_PROBE), runtimes=("runc",))
    monkeypatch.setattr(container, "connect", lambda: client)
    assert cli.main(["doctor", "--docker", "--topology", "tp8"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[ok] docker-engine: Docker 28.2.2 (API 1.50)"
    assert out[1].startswith("[FAIL] nvidia-runtime: runtimes: runc (no nvidia")
    assert out[2] == "[skip] gpus-in-container: skipped: no NVIDIA runtime to give a container GPUs"
    assert out[3:] == [
        "[ok] shm: /dev/shm 62.9 GiB in deepinfer-deepinfer-1 (ipc: host)",
        "[ok] ulimits: memlock unlimited, stack 65536 KiB",
        "[ok] overlay-mount: /src/overlay read-only at /opt/deepinfer/overlay",
    ]


def test_cli_doctor_docker_without_an_engine(monkeypatch, capsys):
    def no_engine():
        raise container.HostError("no Docker engine answers: connection refused")

    monkeypatch.setattr(container, "connect", no_engine)
    assert cli.main(["doctor", "--docker"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "[FAIL] docker-engine: no Docker engine answers: connection refused  -> start the "
        "engine (systemctl start docker) and check that this user may use it"
    )
    assert all(line.startswith("[skip] ") for line in out[1:]) and len(out) == 6
