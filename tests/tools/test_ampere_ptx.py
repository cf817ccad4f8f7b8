"""tools/ampere_ptx: on a newer GPU, Triton kernels are built as sm_80 PTX for the
driver to JIT. Checked here without a GPU by compiling for an sm_90 target in a
subprocess (the switch is process-wide)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.aot

_PROBE = textwrap.dedent(
    """
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from tools import ampere_ptx

    @triton.jit
    def k(x):
        tl.store(x + tl.arange(0, 32), tl.arange(0, 32).to(tl.float32))

    def build():
        src = triton.compiler.ASTSource(fn=k, signature={"x": "*fp32"}, constexprs={})
        return triton.compile(src, target=GPUTarget("cuda", 90, 32))

    native = build()
    ampere_ptx.enable()
    jit = build()
    print(
        native.asm["cubin"][:4] == b"\\x7fELF" and 'target = "cuda:90"' in native.asm["ttgir"],
        jit.asm["cubin"].startswith(b"//") and jit.asm["cubin"].endswith(b"\\0"),
        'target = "cuda:80"' in jit.asm["ttgir"],
    )
    """
)


def test_enable_hands_sm80_ptx_to_the_driver(tmp_path):
    probe = tmp_path / "probe.py"  # Triton reads a kernel's source from its file
    probe.write_text(_PROBE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile for real
    root = Path(__file__).resolve().parents[2]  # the probe imports tools.ampere_ptx
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root / "overlay"), str(root), env.get("PYTHONPATH", "")]
    )
    run = subprocess.run(
        [sys.executable, str(probe)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    native_sm90, ptx_text, lowered_for_sm80 = run.stdout.split()[-3:]
    assert native_sm90 == "True"  # without the switch: sm_90 lowering, a cubin
    assert (ptx_text, lowered_for_sm80) == ("True", "True")


def test_only_the_env_switch_enables_it(monkeypatch):
    from tools import ampere_ptx

    monkeypatch.delenv(ampere_ptx.ENV, raising=False)
    assert ampere_ptx.enable_if_requested() is None
    monkeypatch.setenv(ampere_ptx.ENV, "0")
    assert not ampere_ptx.requested()
