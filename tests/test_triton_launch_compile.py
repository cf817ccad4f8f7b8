"""deepinfer_sm80.triton_launch_compile: the AOT Triton entries are the ones a launch
looks up, and a spec that no launch can produce is refused."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from deepinfer_sm80.ampere_fit import compile_for_ampere
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs

GATHER = "kv_cache.gather[bs=32,gl=0]"

# Run without TRITON_INTERPRET (the tests' own setting), as the AOT build does: build one
# spec's entry for sm_80 (through the launcher, or as triton.compile on a hand-built
# ASTSource lists only the divisible arguments), then launch the kernel as a server does,
# with real tensors and integers, and report which cache entries each step added.
LAUNCH_SCRIPT = r"""
import json, os, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from deepinfer_sm80.kernel_spec import resolve_kernel
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs
from deepinfer_sm80.triton_launch_compile import _torch_dtype, compile_as_launched, target_only

label, builder = sys.argv[1], sys.argv[2]
spec = next(s for s in all_ampere_kernel_specs() if s.label == label)
fn = resolve_kernel(spec.kernel)
cache = os.environ["TRITON_CACHE_DIR"]
entries = lambda: set(os.listdir(cache)) if os.path.isdir(cache) else set()

if builder == "launcher":
    compile_as_launched(spec, 80)
else:
    names = list(fn.arg_names)
    sig = {n: "constexpr" if n in spec.constexprs else spec.signature[n] for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or n in spec.ints_divisible_by_16}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=dict(spec.constexprs),
                                    attrs=attrs)
    triton.compile(src, target=GPUTarget("cuda", 80, 32),
                   options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
built = entries()

def launch(odd=()):
    args = []
    for n in fn.arg_names:
        if n in spec.constexprs:
            args.append(spec.constexprs[n])
        elif spec.signature[n].startswith("*"):
            args.append(torch.empty(64, dtype=_torch_dtype(spec.signature[n])))
        else:  # production-like values: a 5120-wide row stride, a 129-block table row
            args.append(5120 if n in spec.ints_divisible_by_16 and n not in odd else 129)
    before = entries()
    with target_only(80):
        fn.run(*args, grid=(1,), warmup=True, num_warps=spec.num_warps,
               num_stages=spec.num_stages)
    return sorted(entries() - before)

print(json.dumps({"built": len(built), "production": launch(),
                  "odd_stride": launch(odd=(spec.ints_divisible_by_16[0],))}))
"""


def _launch(tmp_path, builder):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / builder)
    run = subprocess.run(
        [sys.executable, "-c", LAUNCH_SCRIPT, GATHER, builder],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.aot
def test_a_launch_finds_the_entry_the_build_wrote(tmp_path):
    """The KV gather spec built for sm_80, then launched as a server launches it: the
    launch compiles nothing. Launched with a row stride that is not a multiple of 16 it
    compiles a new entry, so the check sees a miss; and the entry triton.compile writes
    from a hand-built ASTSource (divisible arguments only) is never found."""
    ours = _launch(tmp_path, "launcher")
    assert ours["built"] == 1
    assert ours["production"] == [], "a production launch compiled again: the AOT entry missed"
    assert len(ours["odd_stride"]) == 1

    hand_built = _launch(tmp_path, "hand-built")
    assert hand_built["built"] == 1
    assert len(hand_built["production"]) == 1, "the hand-built entry was found after all"


@pytest.mark.aot
def test_specs_no_launch_can_produce_are_refused():
    """A bool tensor typed *i1 (Triton types it *u1) and an integer the kernel never
    specializes (do_not_specialize) declared divisible by 16: each is refused, naming
    the argument, instead of building an entry no server looks up."""
    specs = {s.label: s for s in all_ampere_kernel_specs()}
    topk = specs["topk_swa.global_topk[bs=32]"]
    engram = next(s for label, s in specs.items() if label.startswith("engram.lookup"))
    bad = [
        dataclasses.replace(
            topk, label="bool-as-i1", signature={**topk.signature, "is_valid_token_ptr": "*i1"}
        ),
        dataclasses.replace(
            engram,
            label="unspecialized-as-divisible",
            ints_divisible_by_16=(*engram.ints_divisible_by_16, "out_stride"),
        ),
    ]
    reports = {r.label: r.error for r in compile_for_ampere(bad, [80])}
    assert "pointer type '*i1'" in reports["bool-as-i1"]
    assert "out_stride" in reports["unspecialized-as-divisible"]
    assert "divisible by 16" in reports["unspecialized-as-divisible"]


# On a GPU: every shipped spec built for this GPU's capability through the target-only
# driver, then looked up through the real driver with CUDA tensors and integers of the
# spec's properties (warmup: found or compiled, never run); prints what compiled again.
REAL_DRIVER_SCRIPT = r"""
import json, os
import torch
from deepinfer_sm80.kernel_spec import resolve_kernel
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs
from deepinfer_sm80.triton_launch_compile import _torch_dtype, compile_as_launched

major, minor = torch.cuda.get_device_capability()
cc = 10 * major + minor
cache = os.environ["TRITON_CACHE_DIR"]
specs = all_ampere_kernel_specs()
for spec in specs:
    compile_as_launched(spec, cc)
built = set(os.listdir(cache))
again = []
for spec in specs:
    fn = resolve_kernel(spec.kernel)
    args = []
    for n in fn.arg_names:
        if n in spec.constexprs:
            args.append(spec.constexprs[n])
        elif spec.signature[n].startswith("*"):
            args.append(torch.empty(64, dtype=_torch_dtype(spec.signature[n]), device="cuda"))
        elif spec.signature[n] == "fp32":
            args.append(0.5)
        elif spec.signature[n] == "i1":
            args.append(True)
        else:
            args.append(4096 if n in spec.ints_divisible_by_16 else 4097)
    before = set(os.listdir(cache))
    fn.run(*args, grid=(1,), warmup=True, num_warps=spec.num_warps, num_stages=spec.num_stages,
           **({"maxnreg": spec.maxnreg} if spec.maxnreg else {}))
    # a kernel's entry has a __grp__ file; the driver's first use adds its own modules
    new = set(os.listdir(cache)) - before
    if any(f.startswith("__grp__") for e in new for f in os.listdir(os.path.join(cache, e))):
        again.append(spec.label)
print(json.dumps({"cc": cc, "specs": len(specs), "built": len(built), "again": again}))
"""


@pytest.mark.gpu
def test_a_real_driver_finds_the_entries_the_target_only_driver_built(tmp_path):
    """The target-only driver stands in for a GPU in the AOT build; on a GPU, launches
    through the real driver find every entry it built: the key is the same."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    run = subprocess.run([sys.executable, "-c", REAL_DRIVER_SCRIPT], capture_output=True,
                         text=True, env=env, timeout=1200, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["specs"] > 0 and result["built"] > 0
    assert result["again"] == [], result
