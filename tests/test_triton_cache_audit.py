"""deepinfer_sm80.triton_cache_audit: a launch the AOT build did not cover is found in
the cache and named with what its nearest spec would have to say."""

import json
import os
import subprocess
import sys

import pytest

from deepinfer_sm80 import triton_cache_audit
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs

GATHER = "kv_cache.gather[bs=32,gl=0]"

# Without TRITON_INTERPRET: the gather spec's AOT entry for sm_80, then launches as a
# server makes them (real tensors and integers, through Triton's launcher), each with
# one change from the spec (a block table stride too, which the kernel does not
# specialize, so that launch finds the entry); prints the entries the build wrote.
SCRIPT = r"""
import json, os, sys
import torch
from deepinfer_sm80.kernel_spec import resolve_kernel
from deepinfer_sm80.ops.registry import all_ampere_kernel_specs
from deepinfer_sm80.triton_launch_compile import _torch_dtype, compile_as_launched, target_only

spec = next(s for s in all_ampere_kernel_specs() if s.label == sys.argv[1])
fn = resolve_kernel(spec.kernel)
cache = os.environ["TRITON_CACHE_DIR"]
compile_as_launched(spec, 80)
built = sorted(os.listdir(cache))

def launch(values=None, **options):
    args = []
    for n in fn.arg_names:
        if n in (values or {}):
            args.append(values[n])
        elif n in spec.constexprs:
            args.append(spec.constexprs[n])
        elif spec.signature[n].startswith("*"):
            args.append(torch.empty(64, dtype=_torch_dtype(spec.signature[n])))
        else:
            args.append(5120 if n in spec.ints_divisible_by_16 else 129)
    with target_only(80):
        fn.run(*args, grid=(1,), warmup=True, **{"num_warps": spec.num_warps,
               "num_stages": spec.num_stages, **options})

launch()  # as the spec says: found, compiles nothing
launch({"out_stride0": 5121})
launch({"block_table_stride": 16384})  # 1M tokens / 64 a block: not specialized, found
launch({"page_stride": 5121})
launch({"out_stride2": 2})
launch(num_warps=spec.num_warps * 2)
print(json.dumps(built))
"""


@pytest.mark.aot
def test_launches_outside_the_aot_build_are_named_with_their_difference(tmp_path):
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache)
    run = subprocess.run([sys.executable, "-c", SCRIPT, GATHER], capture_output=True,
                         text=True, env=env, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    built = set(json.loads(run.stdout.strip().splitlines()[-1]))
    specs = all_ampere_kernel_specs()

    found = triton_cache_audit.audit(cache, specs, built)
    assert {f["kernel"] for f in found} == {"kv_gather_v4_kernel"}
    assert {f["nearest_spec"] for f in found} == {GATHER}
    assert sorted(d for f in found for d in f["differences"]) == [
        "num_warps/num_stages 4/1 in the launch, 2/1 in the spec",
        "out_stride0: not divisible by 16 in the launch, divisible in the spec",
        "out_stride2: an argument in the launch, a constexpr in the spec",
        "page_stride: not divisible by 16 in the launch, divisible in the spec",
    ]
    assert all(len(f["differences"]) == 1 for f in found)
    # Without the seeded set, the build's own entry shows as a compile that matches its spec
    everything = triton_cache_audit.audit(cache, specs)
    assert [f["differences"] for f in everything if f["entry"] in built] == [[]]


def test_cli_reads_the_seeded_entries_from_the_aot_manifest(tmp_path, capsys):
    (tmp_path / "cache").mkdir()
    assert triton_cache_audit.main([str(tmp_path / "cache"), "--aot", str(tmp_path)]) == 2
    assert "no readable manifest.json" in capsys.readouterr().err
    (tmp_path / "manifest.json").write_text(json.dumps({"entries": []}))
    assert triton_cache_audit.main([str(tmp_path / "cache"), "--aot", str(tmp_path)]) == 0
    assert "0 compiles of our kernels outside the AOT folder" in capsys.readouterr().out
