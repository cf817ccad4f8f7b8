"""deepinfer doctor: each check passes or fails with its fix (fake nvidia-smi, tmp files)."""

import subprocess

from deepinfer_sm80.deploy import doctor

from .test_weights import make_checkpoint

A100 = "NVIDIA A100-SXM4-80GB, 8.0, 81920, 580.95.05"
H200 = "NVIDIA H200, 9.0, 143771, 575.10.01"


def _smi(stdout, rc=0):
    def run(*a, **k):
        return subprocess.CompletedProcess(a, rc, stdout=stdout, stderr="boom" if rc else "")

    return run


def test_gpus_ok_and_counted():
    gpus = doctor._nvidia_smi(_smi("\n".join([A100] * 6)))
    checks = {c.name: c for c in doctor.check_gpus(gpus, needed=6)}
    assert all(c.ok for c in checks.values())
    assert "6 visible" in checks["gpus"].detail
    assert not doctor.check_gpus(gpus, needed=8)[0].ok


def test_not_ampere_old_driver_and_missing_smi():
    checks = {c.name: c for c in doctor.check_gpus(doctor._nvidia_smi(_smi(H200)))}
    assert not checks["ampere"].ok and not checks["driver"].ok
    assert "580.65.06" in checks["driver"].fix

    def missing(*a, **k):
        raise FileNotFoundError

    (c,) = doctor.check_gpus(doctor._nvidia_smi(missing))
    assert not c.ok and "container toolkit" in c.fix
    (c,) = doctor.check_gpus(doctor._nvidia_smi(_smi("", rc=9)))
    assert not c.ok and "boom" in c.detail


def test_host_ram_shm_and_weights(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\n")
    checks = {c.name: c for c in doctor.check_host(meminfo, tmp_path, tmp_path / "none")}
    assert not checks["host-ram"].ok and "engram_cpu_offload" in checks["host-ram"].fix
    assert not checks["weights"].ok and checks["weights"].fix == "deepinfer weights download"
    assert "disk" in checks
    meminfo.write_text("MemTotal:       536870912 kB\n")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    checks = {c.name: c for c in doctor.check_host(meminfo, tmp_path, ckpt)}
    assert checks["host-ram"].ok and checks["weights"].ok and "disk" not in checks


def test_patches_status(tmp_path, capsys):
    from deepinfer_sm80.deploy import cli

    missing = doctor.check_patches(tmp_path / "none.json")
    assert not missing.ok and "has not loaded" in missing.detail
    status = tmp_path / "plugin-status.json"
    status.write_text(
        '{"active": true, "reason": "SM8x GPUs [[8, 0]]", '
        '"patches": {"kv-gather": "applied: 4 sites", "x": "skipped: y"}}'
    )
    check = doctor.check_patches(status)
    assert check.ok and "applied: kv-gather" in check.detail
    assert cli.main(["doctor", "--patches"]) == 0
    assert "kv-gather" in capsys.readouterr().out


def test_host_needs_follow_the_model_facts(tmp_path):
    """Host RAM: the planner's per-node base plus the reported Engram size when offloaded;
    disk: the reported backbone + Engram sizes (configs/model/deepseek-v4.1-flash.yaml)."""
    from deepinfer_sm80.deploy.config_files import model_facts
    from deepinfer_sm80.deploy.nodes import HOST_BASE_GIB

    sizes = model_facts("full")["checkpoint_gib_reported"]
    need = HOST_BASE_GIB + sizes["engram"]
    meminfo = tmp_path / "meminfo"

    def host_ram(gib: float, offload: bool = True):
        meminfo.write_text(f"MemTotal:       {int(gib * 2**20)} kB\n")
        return {c.name: c for c in doctor.check_host(meminfo, tmp_path, None, offload)}["host-ram"]

    assert host_ram(need).ok and f"(need {need:.0f})" in host_ram(need).detail
    assert not host_ram(need - 1).ok
    assert host_ram(HOST_BASE_GIB, offload=False).ok
    assert not host_ram(HOST_BASE_GIB - 1, offload=False).ok
    disk = {c.name: c for c in doctor.check_host(meminfo, tmp_path, tmp_path / "none")}["disk"]
    assert f"weights need ~{sizes['backbone'] + sizes['engram']:.0f})" in disk.detail
