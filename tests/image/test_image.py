"""The image tier (`make test-image`): the built image, started by compose with the test
override on a machine without GPUs, checked from outside.

Needs a Docker engine and the image ``$IMAGE`` (``make test-image`` builds it first).
A missing engine fails here rather than skipping: this tier exists to prove the image.
What it cannot show without GPUs: that vLLM serves the model. The container's GPU path
ends at the launcher's preflight, which is what the no-GPU checks below pin down.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import docker
import pytest

from deepinfer_sm80.deploy import cli, container

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("IMAGE", "deepinfer-sm80:0.33.0")
PROJECT = "deepinfer-imagetest"
COMPOSE = ["docker", "compose", "-p", PROJECT, "-f", "compose.yaml", "-f", "compose.test.yaml"]
TOPOLOGIES = sorted(p.stem for p in (ROOT / "configs" / "topologies").glob("*.yaml"))


def _run(argv, env=None, timeout=600, check=False, drop=()):
    full_env = {**os.environ, "IMAGE": IMAGE, **(env or {})}
    for key in drop:  # e.g. what `make` exports, which would override an --env-file
        full_env.pop(key, None)
    out = subprocess.run(
        argv, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    if check and out.returncode != 0:
        pytest.fail(f"{' '.join(argv)} -> {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


def _in_service(script: str, env=None):
    """Run a shell snippet in a one-off container of the compose service (mounts included)."""
    return _run([*COMPOSE, "run", "--rm", "--no-deps", "--entrypoint", "sh", "deepinfer", "-c",
                 script], env=env)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def engine_and_image():
    """The Docker SDK client; compose itself runs through the `docker compose` CLI."""
    if shutil.which("docker") is None:
        pytest.fail("docker CLI not found: the image tier needs a Docker engine and compose")
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"no Docker engine answers: {exc}")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"image {IMAGE} not built: run `make image`")
    yield client
    _run([*COMPOSE, "down", "--volumes", "--remove-orphans"])


def _service_container(client, service: str = "deepinfer"):
    """The compose service's container, found by its compose labels."""
    ref = container.ContainerRef(project=PROJECT, service=service)
    found = container.find(client, ref)
    assert found is not None, f"no container for {ref.describe()}"
    return found


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_compose_config_validates_for_every_topology(topology):
    gpus = _run(["make", "-s", "--no-print-directory", "-f", "Makefile", "print-gpu-count",
                 f"TOPOLOGY={topology}"], check=True).stdout.strip()  # fmt: skip
    out = _run(["docker", "compose", "-f", "compose.yaml", "config", "--format", "json"],
               env={"TOPOLOGY": topology, "GPU_COUNT": gpus}, check=True)  # fmt: skip
    svc = json.loads(out.stdout)["services"]["deepinfer"]
    assert svc["command"] == [topology]
    device = svc["deploy"]["resources"]["reservations"]["devices"][0]
    assert int(device["count"]) == int(gpus) > 0
    mounts = {v["target"]: v for v in svc["volumes"]}
    assert mounts["/opt/deepinfer/overlay"]["read_only"] is True
    assert mounts["/opt/deepinfer/configs"]["read_only"] is True
    assert svc["ports"][0]["host_ip"] == "127.0.0.1"
    assert svc["healthcheck"]["start_period"] in ("1h30m0s", "90m")


def test_compose_config_validates_with_the_observability_profile():
    out = _run(["docker", "compose", "-f", "compose.yaml", "--profile", "observability",
                "config", "--format", "json"], check=True)  # fmt: skip
    services = json.loads(out.stdout)["services"]
    assert {"deepinfer", "prometheus", "grafana"} <= services.keys()
    for name in ("prometheus", "grafana"):
        ports = services[name]["ports"]
        assert all(p["host_ip"] == "127.0.0.1" for p in ports), f"{name} not on loopback"
        for v in services[name]["volumes"]:
            if v["type"] == "bind":
                assert v["read_only"] is True and Path(v["source"]).exists(), v


@pytest.mark.parametrize("rank", [0, 1])
def test_multinode_compose_config_validates_per_node(rank):
    env_file = f"configs/nodes/node{rank}.env.example"
    out = _run(["docker", "compose", "-f", "compose.multinode.yaml", "--env-file", env_file,
                "config", "--format", "json"], check=True,
               drop=("TOPOLOGY", "GPU_COUNT"))  # fmt: skip
    svc = json.loads(out.stdout)["services"]["deepinfer"]
    assert svc["network_mode"] == "host" and svc["ipc"] == "host"
    assert svc["environment"]["NODE_RANK"] == str(rank)
    assert svc["command"] == ["tp4-pp2-2nodes"]
    assert int(svc["deploy"]["resources"]["reservations"]["devices"][0]["count"]) == 4
    mode = "--live" if rank == 0 else "--worker"
    assert svc["healthcheck"]["test"][-1] == mode


def test_make_up_node_lets_the_env_file_decide():
    """`make` exports TOPOLOGY/GPU_COUNT for single-node use; up-node must not pass them on
    (compose prefers the shell's values over --env-file)."""
    out = _run(["make", "-n", "up-node", "NODE_ENV=configs/nodes/node1.env.example"],
               env={"TOPOLOGY": "tp2-pp3"}, check=True)  # fmt: skip
    assert "env -u TOPOLOGY -u GPU_COUNT docker compose -f compose.multinode.yaml" in out.stdout


def test_router_profile_renders():
    out = _run(["docker", "compose", "-f", "compose.yaml", "--profile", "router", "config",
                "--format", "json"], env={"UPSTREAM_SERVERS": "server 10.0.0.1:8000;"},
               check=True)  # fmt: skip
    router = json.loads(out.stdout)["services"]["router"]
    assert router["environment"]["UPSTREAM_SERVERS"] == "server 10.0.0.1:8000;"


def test_overlay_mount_is_read_only_and_is_what_runs():
    out = _in_service(
        "touch /opt/deepinfer/overlay/probe 2>&1; echo rc=$?; "
        "python -c 'import deepinfer_sm80, sys; print(deepinfer_sm80.__file__)'"
    )
    assert out.returncode == 0, out.stderr
    assert "Read-only file system" in out.stdout and "rc=1" in out.stdout
    assert "/opt/deepinfer/overlay/deepinfer_sm80/__init__.py" in out.stdout


def test_deepinfer_and_vllm_in_the_image():
    out = _in_service(
        "deepinfer --help >/dev/null && echo deepinfer-ok; "
        "python -c 'import vllm, torch, triton, tilelang; "
        "print(vllm.__version__, torch.__version__, triton.__version__, tilelang.__version__)'; "
        "id -un"
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert "deepinfer-ok" in lines
    assert "0.33.0" in lines and "3.8.0" in lines and "0.1.12" in lines
    assert any(x.startswith("2.14.0") for x in lines)
    assert lines[-1] == "deepinfer", "the server must not run as root"


def test_vllm_plugin_loader_finds_and_calls_our_plugin():
    out = _in_service(
        "python - <<'PY'\n"
        "from importlib.metadata import entry_points\n"
        "names = [e.value for e in entry_points(group='vllm.general_plugins')]\n"
        "print('entry', 'deepinfer_sm80.vllm_plugin:register' in names)\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "import json, pathlib\n"
        "s = json.loads(pathlib.Path('/run/deepinfer/plugin-status.json').read_text())\n"
        "print('status', s['active'], s['reason'])\n"
        "PY"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "entry True" in out.stdout
    # No GPU here: the plugin loads, decides it is inactive, and says why.
    assert "status False" in out.stdout and "not SM8x" in out.stdout


def test_aot_kernels_are_in_the_image():
    out = _in_service("cat $DEEPINFER_AOT_DIR/manifest.json")
    assert out.returncode == 0, out.stderr
    manifest = json.loads(out.stdout)
    assert manifest["arches"] == ["sm_80", "sm_86"]
    assert manifest["kernels"] and all(k["error"] is None for k in manifest["kernels"])
    assert manifest["entries"]
    out = _in_service("cat $DEEPINFER_AOT_DIR/mhc/manifest.json")
    assert out.returncode == 0, out.stderr
    mhc = json.loads(out.stdout)
    assert mhc["arches"] == ["sm_80", "sm_86"]
    assert mhc["kernels"] and all(k["error"] is None for k in mhc["kernels"])
    out = _in_service("cat $DEEPINFER_AOT_DIR/sparse_mla/manifest.json")
    assert out.returncode == 0, out.stderr
    mla = json.loads(out.stdout)
    assert mla["arches"] == ["sm_80", "sm_86"]
    # (decode: 3 index widths and the throughput split; prefill: 2 over bf16 rows) x
    # (wide kernel, narrow kernel for <= 8 heads) x 2 arches
    assert len(mla["kernels"]) == 24 and all(k["error"] is None for k in mla["kernels"])
    assert sum(k["label"].endswith(",h8]") for k in mla["kernels"]) == 12
    throughput = [
        k for k in mla["kernels"] if k["label"].startswith("sparse_mla.decode_tl[128+512,r640")
    ]
    assert len(throughput) == 4
    assert sum(k["label"].startswith("sparse_mla.prefill_tl[") for k in mla["kernels"]) == 8
    # vLLM's mHC pre-norm kernels on Ampere: the epilogue's 7 warmup keys and the GEMM's 6
    # (two widths x three token-count classes), x 2 arches
    out = _in_service("cat $DEEPINFER_AOT_DIR/vllm_mhc/manifest.json")
    assert out.returncode == 0, out.stderr
    vllm_mhc = json.loads(out.stdout)
    assert vllm_mhc["arches"] == ["sm_80", "sm_86"] and vllm_mhc["vllm"] == "0.33.0"
    assert len(vllm_mhc["kernels"]) == 26
    assert sum(k["label"].startswith("vllm.hc_prenorm_gemm[") for k in vllm_mhc["kernels"]) == 12
    assert all(k["error"] is None for k in vllm_mhc["kernels"])


def test_the_images_triton_entries_are_what_its_launches_look_up():
    """In the serving container: its Triton build is the one that compiled the AOT folder
    (the manifest's triton_build), and every shipped spec launched through Triton's
    launcher for sm_80 and sm_86 (no GPU: a driver that names the target) finds its entry
    in a cache seeded from the folder, so nothing compiles."""
    out = _in_service(
        "python - <<'PY'\n"
        "import os, tempfile\n"
        "from pathlib import Path\n"
        "cache = tempfile.mkdtemp()\n"
        "os.environ['TRITON_CACHE_DIR'] = cache\n"
        "from deepinfer_sm80 import aot\n"
        "from deepinfer_sm80.ops.registry import all_ampere_kernel_specs\n"
        "from deepinfer_sm80.triton_launch_compile import compile_as_launched\n"
        "src = Path(os.environ['DEEPINFER_AOT_DIR'])\n"
        "aot.check_triton_build(src)\n"
        "print('seeded', aot.seed(src, Path(cache)))\n"
        "before = set(os.listdir(cache))\n"
        "specs = all_ampere_kernel_specs()\n"
        "for spec in specs:\n"
        "    for cc in (80, 86):\n"
        "        compile_as_launched(spec, cc)\n"
        "print('launched', 2 * len(specs), 'compiled', sorted(set(os.listdir(cache)) - before))\n"
        "PY"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    seeded = int(out.stdout.split("seeded ")[1].split()[0])
    assert seeded > 0
    assert "compiled []" in out.stdout, out.stdout


def test_the_images_vllm_mhc_builds_are_what_vllms_warmup_loads():
    """In the serving container: with the TileLang cache seeded from the folder and
    TileLang's detector reporting sm_80, then sm_86, vLLM's own warmup call
    (``MHC_PRE_NORM_KERNEL.compile_many``) over every key its warmup asks for on Ampere
    compiles nothing, nor does vLLM's pre-norm GEMM for any of its keys. (No GPU: the
    kernels are decorated as on CUDA, ``vllm_mhc_aot``.)"""
    out = _in_service(
        "python - <<'PY'\n"
        "import os, tempfile\n"
        "from pathlib import Path\n"
        "cache = tempfile.mkdtemp()\n"
        "os.environ['TILELANG_CACHE_DIR'] = cache\n"
        "import tilelang.cuda.target as cuda_target\n"
        "from tilelang.cache import _dispatch_map\n"
        "from tilelang.jit.kernel import JITKernel\n"
        "from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL as kernel\n"
        "from vllm.model_executor.kernels.mhc import tilelang_kernels as tk\n"
        "from deepinfer_sm80 import aot, tilelang_build, vllm_mhc_aot\n"
        "from deepinfer_sm80.ops.mhc.warmup import MhcModelConfig\n"
        "src = aot.tilelang_aot_dir(os.environ['DEEPINFER_AOT_DIR'], aot.VLLM_MHC_SUBDIR)\n"
        "print('seeded', tilelang_build.seed_tilelang_cache(src, cache))\n"
        "compiled = []\n"
        "JITKernel._compile_and_create_adapter = lambda self, *a, **k: compiled.append(1)\n"
        "cuda_target.check_cuda_availability = lambda: True\n"
        "kernel.kernel = vllm_mhc_aot.server_kernel()\n"
        "keys = vllm_mhc_aot.warmup_keys(MhcModelConfig(), 8192)\n"
        "tk.hc_prenorm_gemm_tilelang = vllm_mhc_aot.server_prenorm_gemm(False)\n"
        "tk.hc_prenorm_gemm_block_m_tilelang = vllm_mhc_aot.server_prenorm_gemm(True)\n"
        "gemm_keys = vllm_mhc_aot.prenorm_gemm_keys(MhcModelConfig(), 8192)\n"
        "for arch in ('sm_80', 'sm_86'):\n"
        "    cuda_target._detect_torch_cuda_arch = lambda: arch\n"
        "    for c in _dispatch_map.values():\n"
        "        c._memory_cache = {}\n"
        "    kernel._compiled_cache = {}\n"
        "    kernel.compile_many(keys)\n"
        "    loaded = len(kernel._compiled_cache)\n"
        "    print(arch, 'keys', len(keys), 'loaded', loaded, 'compiled', len(compiled))\n"
        "    for key in gemm_keys:\n"
        "        tk._HC_PRENORM_GEMM_TILELANG_KERNEL.compile(key)\n"
        "    print(arch, 'gemm keys', len(gemm_keys), 'compiled', len(compiled))\n"
        "PY"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert int(out.stdout.split("seeded ")[1].split()[0]) > 0
    for arch in ("sm_80", "sm_86"):
        assert f"{arch} keys 7 loaded 7 compiled 0" in out.stdout, out.stdout
        assert f"{arch} gemm keys 6 compiled 0" in out.stdout, out.stdout


def test_the_image_samples_with_vllms_sampler_as_flashinfer_cannot_jit_there():
    """vLLM would JIT-compile FlashInfer's top-k/top-p sampler during the first start's
    memory profiling; in the image FlashInfer's JIT finds no CUDA toolkit, so the image
    sets VLLM_USE_FLASHINFER_SAMPLER=0 and vLLM reads it as off. If the image gains a
    toolkit FlashInfer can build with, this fails: FlashInfer's sampler is then an option
    to measure again."""
    out = _in_service(
        "python - <<'PY'\n"
        "import os\n"
        "import vllm.envs as envs\n"
        "print('env', os.environ.get('VLLM_USE_FLASHINFER_SAMPLER'),\n"
        "      'vllm reads', envs.VLLM_USE_FLASHINFER_SAMPLER)\n"
        "from flashinfer.jit.cpp_ext import get_cuda_path\n"
        "try:\n"
        "    print('toolkit', get_cuda_path())\n"
        "except RuntimeError as exc:\n"
        "    print('no toolkit:', exc)\n"
        "PY"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "env 0 vllm reads False" in out.stdout, out.stdout
    assert "no toolkit: Could not find nvcc" in out.stdout, out.stdout


def test_launcher_renders_or_refuses_in_the_image():
    out = _in_service("deepinfer launch tp8 --dry-run")
    assert out.returncode == 0, out.stderr
    assert "vllm serve deepseek-ai/DeepSeek-V4.1-Flash" in out.stdout
    out = _in_service("deepinfer launch tp2-pp3 --dry-run; echo rc=$?")
    assert "rc=2" in out.stdout and "refused before launch" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("topology", "relay", "code", "message"),
    [
        # Launchable topology, no GPUs: the preflight stops it with the fix.
        ("tp8", "0", 3, "preflight gpus"),
        # The default topology needs the pipeline relay, off by default: refused up front.
        ("tp2-pp3", "0", 2, "refused before launch"),
        # Opted in through .env / compose: it validates, then the preflight stops it.
        ("tp2-pp3", "1", 3, "preflight gpus"),
    ],
)
def test_service_without_gpus_exits_with_a_clear_message(
    engine_and_image, topology, relay, code, message, capsys
):
    """A refusal ends in the one-shot deepinfer-check, with its code and message; the
    server's container is never started, so nothing restarts it."""
    env = {"TOPOLOGY": topology, "GPU_COUNT": "1", "DEEPINFER_PP_RELAY": relay}
    up = _run([*COMPOSE, "up", "-d", "--no-build", "deepinfer"], env=env, timeout=300)
    assert up.returncode != 0, "compose started the server despite the refusal"
    # The check's container as the engine saw it (SDK, not CLI text): how it ended, that
    # it did not restart, who ran it, what was mounted how.
    check = _service_container(engine_and_image, "deepinfer-check")
    state = check.attrs["State"]
    assert (state["Status"], state["ExitCode"], check.attrs["RestartCount"]) == ("exited", code, 0)
    assert check.attrs["Config"]["User"] == "deepinfer", "the server must not run as root"
    mounts = {m["Destination"]: m for m in check.attrs["Mounts"]}
    assert mounts["/opt/deepinfer/overlay"]["RW"] is False
    assert mounts["/opt/deepinfer/configs"]["RW"] is False
    logs = check.logs().decode(errors="replace")
    assert message in logs
    assert "Traceback" not in logs
    server = container.find(engine_and_image, container.ContainerRef(PROJECT, "deepinfer"))
    assert server is None or server.attrs["State"]["Status"] == "created", server.attrs["State"]
    # `deepinfer health` from the host says the same at once, with the container's last lines.
    argv = ["health", "--ready", "--service", "deepinfer-check", "--project", PROJECT,
            "--wait", "60"]  # fmt: skip
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"unhealthy: container: container {check.name} has exited with exit code {code}; its "
        "last log lines:\n"
    ), err
    assert message in err and "Traceback" not in err
    _run([*COMPOSE, "down", "--volumes"], env=env)


def test_refusal_and_crash_restart_policies():
    out = _run(["docker", "compose", "-f", "compose.yaml", "--profile", "router", "config",
                "--format", "json"], check=True)  # fmt: skip
    services = json.loads(out.stdout)["services"]
    for check, server in (("deepinfer-check", "deepinfer"), ("router-check", "router")):
        assert services[check]["restart"] == "no"
        assert services[server]["restart"] == "unless-stopped"
        dep = services[server]["depends_on"][check]
        assert dep["condition"] == "service_completed_successfully"


def test_healthcheck_fails_cleanly_without_a_server():
    out = _in_service("deepinfer-healthcheck; echo rc=$?")
    assert "rc=0" not in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
