"""Where a CTA of the narrow sparse-MLA decode kernel (8 heads per rank) spends its time:
per-CTA phase clocks from an instrumented copy of ``attention_sm80.cuh``.

The copy is made at run time: ``instrumented_source`` inserts marks at six anchors of
``attention_cta_narrow``, where thread 0 writes the low 32 bits of ``clock64`` (and, at the
first and last mark, ``%globaltimer`` and ``%smid``) into the lse columns the kernel never
writes with 8 heads (8 to 51 of the 64 padded heads; 11 words per split). Phases:

- prologue: entry to the row tables being ready (lengths, index rows, scale bytes: three
  dependent global loads, then the tables);
- first tile: tables ready to the first tile's first barrier (its loads' latency, decode
  and QK);
- loop: tables ready to the end of the tile loop (the first tile included);
- epilogue: the output staged and the split partials stored;
- arrival: the merge counter's atomic, plus the fold in the CTA that arrives last.

The anchors are strings of the kernel source; if the kernel changes under them,
``instrumented_source`` refuses with the anchor's name (a CPU test checks they still
match). The marks add no registers on sm_80 (122, as shipped) but are not free: compare
spans with the uninstrumented kernel's timings, not as a replacement for them.

Run on a CUDA GPU: ``PYTHONPATH=overlay:. python -m benchmarks.sparse_mla_profile_decode_phases``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

WORDS_PER_SPLIT = 11  # 6 clocks, smid, globaltimer at entry and exit (2 words each)
FIRST_COLUMN = 8  # lse columns past the 8 real heads
MAX_SPLITS = 4  # 640 rows at 192 per split; 8 + 4 x 11 = 52 <= 64 columns

_MARK = "prof_mark(lse_ptr, t, lse_stride_t, split, {k});"

_HELPER = r"""
// Inserted by benchmarks/sparse_mla_profile_decode_phases.py: thread 0 writes phase clocks into
// lse[t, 8 + 11 split + k] (columns past the 8 real heads, which the kernel never writes).
__device__ __forceinline__ void prof_mark(float* lse_ptr, int64_t t, int64_t stride, int split,
                                          int k) {
  if (threadIdx.x != 0) return;
  unsigned* u = reinterpret_cast<unsigned*>(lse_ptr + t * stride + 8 + 11 * split);
  if (k == 0 || k == 5) {
    unsigned long long g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
    u[k == 0 ? 7 : 9] = static_cast<unsigned>(g);
    u[k == 0 ? 8 : 10] = static_cast<unsigned>(g >> 32);
  }
  if (k == 0) {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    u[6] = s;
  }
  u[k] = static_cast<unsigned>(clock64());
}

"""

# (name, anchor in attention_cta_narrow, replacement); each anchor must occur exactly once
# in the narrow kernel's text.
_ANCHORS = (
    ("entry", "  const bool nope = !kBf16Rows && warp < kNopeWarps;\n", "{a}  {m0}\n"),
    (
        "tables ready",
        "  __syncthreads();  // sm.scale and sm.field are complete\n",
        "{a}  {m1}\n",
    ),
    (
        "first tile's first barrier",
        "    __syncthreads();\n\n    // 3. Owner of heads `warp`",
        "    __syncthreads();\n    if (r0 == r_begin) {m2}\n\n    // 3. Owner of heads `warp`",
    ),
    (
        "tile loop done",
        "  // One n-tile of 8 heads at a time through the stage;",
        "  {m3}\n{a}",
    ),
    (
        "partials stored",
        "      if (nt == kHeadTiles - 1)  // every head's partials are stored\n",
        "      {m4}\n{a}",
    ),
)
_END_ANCHOR = "lse_stride_t, sink_addr, num_heads, &sm.alpha[0]);\n    }\n  }\n}\n"


def instrumented_source(source: str) -> str:
    """``source`` (attention_sm80.cuh) with the narrow kernel's phase marks inserted."""
    head = "__device__ __forceinline__ void attention_cta_narrow("
    if source.count(head) != 1:
        raise ValueError(
            "sparse_mla_profile_decode_phases: attention_cta_narrow not found once in the source"
        )
    start = source.rindex("template <", 0, source.index(head))
    before, kernel = source[:start], source[start:]
    marks = {f"m{k}": _MARK.format(k=k) for k in range(6)}
    for name, anchor, replacement in _ANCHORS:
        if kernel.count(anchor) != 1:
            raise ValueError(
                f"sparse_mla_profile_decode_phases: anchor {name!r} occurs "
                f"{kernel.count(anchor)} times "
                "in attention_cta_narrow (expected once): update _ANCHORS to the kernel"
            )
        kernel = kernel.replace(anchor, replacement.format(a=anchor, **marks))
    if kernel.count(_END_ANCHOR) != 1:
        raise ValueError(
            "sparse_mla_profile_decode_phases: anchor 'kernel end' not found once in "
            "attention_cta_narrow: "
            "update _END_ANCHOR to the kernel"
        )
    # The last mark after the merge (or the arrival), once every thread is done.
    closing = _END_ANCHOR[: -len("}\n")] + f"  __syncthreads();\n  {marks['m5']}\n}}\n"
    kernel = kernel.replace(_END_ANCHOR, closing)
    return before + _HELPER + kernel


def phases(words, ghz: float):
    """Per-CTA phase durations in us from the lse words ``[T, MAX_SPLITS, 11]`` (int64,
    the uint32 values): clocks are per SM, so only differences within a CTA are used."""
    import numpy as np

    c = words[..., :6]

    def cycles(a: int, b: int):
        return (c[..., b] - c[..., a]) % (1 << 32)

    to_us = 1.0 / (ghz * 1e3)
    arrival = cycles(4, 5) * to_us
    return {
        "prologue": cycles(0, 1) * to_us,
        "first tile": cycles(1, 2) * to_us,
        "loop": cycles(1, 3) * to_us,
        "epilogue": cycles(3, 4) * to_us,
        "arrival": arrival,
        "total": cycles(0, 5) * to_us,
        # the CTA that arrived last merged: the longest arrival of its token
        "merged": arrival == np.max(arrival, axis=-1, keepdims=True),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", action="store_true", help="keep the L2 warm between calls")
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    import numpy as np
    import torch

    from benchmarks.microbench_sparse_mla import build_registry
    from benchmarks.runner import device_info
    from deepinfer_sm80.ops.sparse_mla import tilelang_kernels
    from deepinfer_sm80.ops.sparse_mla.engine import DECODE_ENGINE_ENV

    if not torch.cuda.is_available():
        raise SystemExit("sparse_mla_profile_decode_phases: needs a CUDA GPU")
    patched = Path(tempfile.mkdtemp()) / "attention_sm80_phases.cuh"
    patched.write_text(instrumented_source(tilelang_kernels.SOURCE_FILE.read_text()))
    tilelang_kernels.SOURCE_FILE = patched
    os.environ[DECODE_ENGINE_ENV] = "tilelang"
    seen = {}
    launch = tilelang_kernels.launch

    def keep_lse(*a, **k):
        seen["lse"] = a[2]
        return launch(*a, **k)

    tilelang_kernels.launch = keep_lse
    info = device_info()
    print(
        f"{info['gpu']} | torch {info['torch']} | tilelang {info['tilelang']} | "
        f"{'warm' if args.warm else 'cold'} L2 | clocks of thread 0 per CTA, medians over "
        "CTAs; 'slots' = sum over CTAs / (2 CTAs per SM)"
    )
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    slots = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    wanted = [f"mla_decode_T{t}_H8_w128+512" for t in (1, 16, 64, 256)]
    cases = {c.name: c for c in build_registry().cases()}
    for name in wanted:
        case = cases[name]
        state = case.setup()
        case.candidate(state)
        spans, last = [], None
        for _ in range(args.calls):
            if not args.warm:
                flush.zero_()
            torch.cuda.synchronize()
            case.candidate(state)
            torch.cuda.synchronize()
            lse = seen["lse"]
            cols = lse[:, FIRST_COLUMN : FIRST_COLUMN + MAX_SPLITS * WORDS_PER_SPLIT]
            raw = cols.contiguous().view(torch.int32).cpu().numpy().astype(np.int64) & 0xFFFFFFFF
            last = raw.reshape(lse.shape[0], MAX_SPLITS, WORDS_PER_SPLIT)
            g0 = last[..., 7] | (last[..., 8] << 32)
            g5 = last[..., 9] | (last[..., 10] << 32)
            spans.append((g5.max() - g0.min()) / 1e3)
        # SM clock while it ran: a CTA's cycles over its globaltimer nanoseconds
        cycles = (last[..., 5] - last[..., 0]) % (1 << 32)
        ns = (last[..., 9] | (last[..., 10] << 32)) - (last[..., 7] | (last[..., 8] << 32))
        ghz = float(np.median(cycles / np.maximum(ns, 1)))
        ph = phases(last, ghz)
        merged = ph.pop("merged")
        print(
            f"{name}: {last.shape[0] * MAX_SPLITS} CTAs, span {np.median(spans):.1f} us "
            f"(globaltimer), SM clock {ghz:.2f} GHz"
        )
        for key, v in ph.items():
            if key == "arrival":
                for who, sel in (("merging", merged), ("others", ~merged)):
                    print(
                        f"  arrival ({who:8s}) median {np.median(v[sel]):6.2f} us"
                        f"  slots {v[sel].sum() / slots:7.2f} us"
                    )
                continue
            print(
                f"  {key:19s} median {np.median(v):6.2f} us  p10 {np.percentile(v, 10):6.2f}"
                f"  p90 {np.percentile(v, 90):6.2f}  slots {v.sum() / slots:7.2f} us"
            )
        del state


if __name__ == "__main__":
    main()
