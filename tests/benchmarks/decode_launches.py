"""The TileLang decode without a GPU, for the A/B benchmarks' tests: launch() with a kernel
lookup that records each variant it is asked for and returns a no-op, and a variant
lowered by TileLang for sm_80 (no nvcc)."""

import torch

from deepinfer_sm80.ops.sparse_mla import tilelang_kernels


def record_variants(monkeypatch) -> list:
    """Variants ``launch`` builds from here on, in order (nothing compiles or runs)."""
    built = []

    def fake_get_kernel(variant):
        built.append(variant)
        return lambda *args: None

    monkeypatch.setattr(tilelang_kernels, "get_kernel", fake_get_kernel)
    monkeypatch.setattr(tilelang_kernels, "_note_first_use", lambda v: None)
    return built


def launch(heads: int, T: int = 2) -> None:
    """One decode launch of T tokens over 640 rows of a 3-page cache, 192-row splits."""
    q = torch.zeros(T, 64, 512, dtype=torch.bfloat16)
    cache = torch.zeros(3, 256, 584, dtype=torch.uint8)
    idx = torch.zeros(T, 640, dtype=torch.int32)
    lens = torch.full((T,), 640, dtype=torch.int32)
    lse = torch.zeros(T, 64)
    args = (q, q.clone(), lse, cache, idx, lens, None, None, None, None, 1.0)
    tilelang_kernels.launch(*args, heads, 192, 1, lse, lse, None)


def lowered(variant) -> tuple[str, str]:
    """TileLang's host launch call and device source of ``variant`` for sm_80, lowered
    without nvcc."""
    import tilelang
    import tvm
    from tvm.target import Target

    from deepinfer_sm80.tilelang_build import cuda_target

    target = Target(cuda_target(80))
    with tvm.transform.PassContext(config=variant.pass_configs()), target:
        artifact = tilelang.lower(variant.build(), target=target)
    (launch,) = [
        line.strip()
        for line in str(artifact.host_mod).splitlines()
        if 'call_packed("kernel_kernel"' in line
    ]
    return launch, str(artifact.kernel_source)
