"""mHC boundary: fused post + delayed pre (suite ``mhc``).

Candidate: ``deepinfer_sm80.ops.mhc.mhc_fused_post_pre_delayed`` (8 hidden slices of 640,
CUDA-core fused kernel below 16 tokens, TF32 ``T.gemm`` from 16, one epilogue).

Baselines, each checked against the candidate before anything is timed:
(a) ``torch-unfused``: the fp32 PyTorch reference path (``ops/mhc/ref.py``), op by op;
(b) ``vllm-ampere-rebuilt``: stock vLLM 0.33.0's Ampere strategy, rebuilt in TileLang
    (``baselines/mhc_token_grid_fused_unsplit_gemm.py``): a token-grid fused kernel up to 32
    tokens, else post + an unsplit fp32 CUDA-core GEMM, then a per-token epilogue.

Targets vs (b): >= 2.5x at T=12 and >= 1.3x at T=6 (``params["target_speedup"]``, judged
after the run at the candidate's p80 time). The sweep to T=1024 reports achieved
bandwidth against the device copy bandwidth measured in the same run, counting the op's
minimum traffic: residual and x read, mixed residual and layer input written (100 KiB a
token) plus the 1.9 MiB of fp32 weights read once.

Run: ``PYTHONPATH=overlay:. python -m benchmarks.microbench_mhc``
"""

import sys

import torch

from benchmarks.runner import Case, CheckResult, Registry, main_for_suite

SUITE = "mhc"
SWEEP = (1, 2, 4, 6, 8, 12, 15, 16, 24, 32, 48, 64, 128, 256, 512, 1024)
TARGETS = {12: 2.5, 6: 1.3}
TORCH_CASES = (1, 12, 128, 1024)
FP32_ATOL = 1.9e-3
# Against (b) the fp32 outputs may differ by more: up to 32 tokens vLLM's fused kernel
# feeds the GEMM the *unrounded* fp32 mixed residual, while ours (like vLLM's unfused
# path and its PyTorch oracle) projects the bf16 residual it materializes. That moves the
# mixes by ~2^-9 relative; both sides are checked against the fp32 reference in
# tests/ops/test_mhc.py (ours within 1.9e-3).
FP32_ATOL_VS_VLLM_FUSED = 5e-3
BF16_REL = 1e-2

_baseline = None


def _vllm_rebuilt():
    """Compile the baseline's kernels once (lazily: building the registry needs no GPU)."""
    global _baseline
    if _baseline is None:
        import tilelang

        from benchmarks.baselines.mhc_token_grid_fused_unsplit_gemm import (
            TokenGridFusedUnsplitGemm,
        )
        from deepinfer_sm80.ops.mhc.inputs import MODEL_SCALARS, NORM_EPS
        from deepinfer_sm80.tilelang_build import ampere_pass_configs

        s = MODEL_SCALARS
        eps = {
            "rms_eps": s["rms_eps"],
            "pre_eps": s["hc_pre_eps"],
            "sk_eps": s["hc_sinkhorn_eps"],
            "post_mult": s["hc_post_mult_value"],
            "repeat": s["sinkhorn_repeat"],
            "norm_eps": NORM_EPS,
        }
        configs = ampere_pass_configs()

        def compile_fn(func):
            return tilelang.compile(func, execution_backend="tvm_ffi", pass_configs=configs)

        _baseline = TokenGridFusedUnsplitGemm(5120, 4, eps, compile_fn)
    return _baseline


def _inputs(num_tokens):
    from deepinfer_sm80.ops.mhc.inputs import model_like_inputs

    return model_like_inputs(num_tokens, "cuda", seed=num_tokens)


def _ours(inp):
    from deepinfer_sm80.ops.mhc import mhc_fused_post_pre_delayed
    from deepinfer_sm80.ops.mhc.inputs import NORM_EPS

    return mhc_fused_post_pre_delayed(
        *inp.positional(), pre_mix=inp.pre_mix, norm_weight=inp.norm_weight, norm_eps=NORM_EPS
    )[:5]


def _torch_unfused(inp):
    from deepinfer_sm80.ops.mhc.inputs import NORM_EPS
    from deepinfer_sm80.ops.mhc.ref import fused_post_pre_delayed_ref

    return fused_post_pre_delayed_ref(
        *inp.positional(), pre_mix=inp.pre_mix, norm_weight=inp.norm_weight, norm_eps=NORM_EPS
    )[:5]


def _rebuilt(inp):
    return _vllm_rebuilt()(
        inp.x,
        inp.residual,
        inp.post_layer_mix,
        inp.comb_res_mix,
        inp.fn,
        inp.hc_scale,
        inp.hc_base,
        inp.pre_mix,
        inp.norm_weight,
    )


def outputs_agree(base, cand, fp32_atol: float = FP32_ATOL) -> CheckResult:
    """fp32 outputs (post, comb, pre) within ``fp32_atol``; bf16 ones (residual, layer
    input) within 1% relative Frobenius error; no NaN or inf anywhere."""
    names = ("residual_cur", "post", "comb", "layer_input", "next_pre")
    details = []
    ok = True
    for name, b, c in zip(names, base, cand, strict=True):
        if b.shape != c.shape:
            return CheckResult(False, f"{name}: shape {tuple(c.shape)} vs {tuple(b.shape)}")
        cf, bf = c.float(), b.float()
        if not torch.isfinite(cf).all():
            return CheckResult(False, f"{name}: non-finite values in the candidate")
        if c.dtype == torch.float32:
            err = float((cf - bf).abs().max())
            ok &= err <= fp32_atol
            details.append(f"{name} max abs {err:.1e}")
        else:
            rel = float((cf - bf).norm() / bf.norm().clamp_min(1e-30))
            ok &= rel <= BF16_REL
            details.append(f"{name} rel {rel:.1e}")
    return CheckResult(ok, "; ".join(details))


def _bytes(num_tokens: int) -> int:
    per_token = (2 * 4 * 5120 + 2 * 5120) * 2  # residual + x read, residual' + input written
    coefficients = (16 + 4 + 4) * 4 + (4 + 16 + 4) * 4  # in, and post/comb/pre out
    return num_tokens * (per_token + coefficients) + 24 * 4 * 5120 * 4


def _case(registry, num_tokens, baseline_name, baseline, suffix=""):
    params = {"T": num_tokens, "hidden": 5120, "hc": 4, "splits": 8}
    atol = FP32_ATOL
    if baseline_name == "vllm-ampere-rebuilt":
        atol = FP32_ATOL_VS_VLLM_FUSED
        if num_tokens in TARGETS:
            params["target_speedup"] = TARGETS[num_tokens]
    registry.add(
        Case(
            suite=SUITE,
            name=f"fused_T{num_tokens}{suffix}",
            params=params,
            setup=lambda: _inputs(num_tokens),
            baseline_name=baseline_name,
            baseline=baseline,
            candidate_name="deepinfer mhc_fused_post_pre_delayed",
            candidate=_ours,
            check=lambda s, b, c: outputs_agree(b, c, atol),
            bytes_moved=lambda s: _bytes(num_tokens),
        )
    )


def build_registry() -> Registry:
    registry = Registry()
    for t in SWEEP:
        _case(registry, t, "vllm-ampere-rebuilt", _rebuilt)
    for t in TORCH_CASES:
        _case(registry, t, "torch-unfused", _torch_unfused, suffix="_vs_torch")
    return registry


def judge_targets(report: dict) -> list[str]:
    """One line per speed-up target: measured vs wanted, judged like the runner's gates
    at the candidate's p80 time (baseline median / candidate p80), the median's figure
    shown beside it."""
    lines = []
    for row in report["cases"]:
        want = row["params"].get("target_speedup")
        if want is None:
            continue
        if "candidate_us" not in row:
            lines.append(f"{row['case']}: n/a vs target {want}x: MISS")
            continue
        at_p80 = row["baseline_us"]["median"] / row["candidate_us"]["p80"]
        verdict = "PASS" if at_p80 >= want else "MISS"
        lines.append(
            f"{row['case']}: {at_p80:.2f}x at p80 ({row['speedup']:.2f}x at the median) "
            f"vs target {want}x: {verdict}"
        )
    return lines


def kernel_breakdown(tokens=(1, 6, 12, 16, 128, 1024), reps: int = 20) -> None:
    """Device time per call (torch.profiler, warm L2) of the candidate and baseline (b).

    Every TileLang kernel is named ``kernel_kernel``, so the profiler sums a call's kernels
    into one row: the figure is the whole op's device time, without launch gaps."""
    from torch.profiler import ProfilerActivity, profile

    for t in tokens:
        inp = _inputs(t)
        for name, fn in (("ours", _ours), ("vllm-rebuilt", _rebuilt)):
            for _ in range(3):
                fn(inp)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    fn(inp)
                torch.cuda.synchronize()
            rows = []
            for ev in prof.key_averages():
                if ev.device_type.name == "CUDA" and ev.count:
                    us = ev.device_time_total / reps
                    rows.append(f"{ev.key[:40]}={us:.2f}us")
            print(f"[{SUITE}] breakdown T={t} {name}: " + ", ".join(rows), flush=True)


def _event_us(fn, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def tile_sweep() -> None:
    """Back-to-back time of the fused kernel alone for other compile configs than the
    shipped ones. Launches are not hidden here: in the H200 run every small-T row took
    15-24 us whatever the config (the kernels' device time was ~5-13 us), i.e. the host's
    launch path dominated, so only the large-T rows compare kernels."""
    from deepinfer_sm80.ops.mhc.variants import KernelVariant
    from deepinfer_sm80.tilelang_build import get_kernel

    def launch(kernel, inp, t, rows):
        n = t
        res = torch.empty_like(inp.residual)
        li = torch.empty(n, 5120, dtype=torch.bfloat16, device="cuda")
        mp = torch.empty(rows, n, 24, dtype=torch.float32, device="cuda")
        sp = torch.empty(rows, n, dtype=torch.float32, device="cuda")
        yp = torch.empty(rows, n, dtype=torch.float32, device="cuda")
        post = inp.post_layer_mix.view(n, 4)
        args = (inp.comb_res_mix, inp.residual, post, inp.x, inp.pre_mix, inp.fn)
        return lambda: kernel(*args, res, li, li, mp, sp, yp, 1, 0)

    for t, groups in ((1, (1, 2)), (6, (2, 3, 4)), (12, (3, 4))):
        inp = _inputs(t)
        for group in groups:
            for tile_n in (1, 2, 3, 4, 6):
                v = KernelVariant.make(
                    "post_prenorm_small",
                    hidden=5120,
                    hc=4,
                    token_group=group,
                    tile_n=tile_n,
                    hoist_loads=group <= 3,
                )
                us = _event_us(launch(get_kernel(v), inp, t, 8))
                print(f"[{SUITE}] sweep small T={t} group={group} tile_n={tile_n}: {us:.2f} us")
    for t in (16, 64, 256, 1024):
        inp = _inputs(t)
        for block_m, block_h, stages, sub in ((16, 16, 3, 5), (16, 16, 2, 5), (32, 16, 2, 5)):
            v = KernelVariant.make(
                "post_prenorm_tc",
                hidden=5120,
                hc=4,
                block_m=block_m,
                block_h=block_h,
                num_stages=stages,
                threads=128,
                sub_blocks=sub,
            )
            try:
                us = _event_us(launch(get_kernel(v), inp, t, 8 * sub))
            except Exception as exc:  # noqa: BLE001 -- a config that does not build is data
                print(f"[{SUITE}] sweep tc bm{block_m} bh{block_h} st{stages}: {exc!r}"[:300])
                continue
            print(
                f"[{SUITE}] sweep tc T={t} bm={block_m} bh={block_h} st={stages} "
                f"sub={sub}: {us:.2f} us"
            )


def main() -> int:
    from benchmarks.runner import RESULTS_DIR, gpu_slug

    if "--breakdown" in sys.argv:
        kernel_breakdown()
        tile_sweep()
        return 0
    rc = main_for_suite(SUITE, build_registry())
    import json

    info_gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "unknown_gpu"
    path = RESULTS_DIR / f"{gpu_slug(info_gpu)}.json"
    if path.exists():
        report = json.loads(path.read_text())["suites"].get(SUITE)
        if report:
            for line in judge_targets(report):
                print(f"[{SUITE}] {line}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
