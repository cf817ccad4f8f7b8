"""Where a server's start went, read from its log: the durations vLLM and the plugin log
as they start, and the Triton kernels vLLM's JIT monitor saw compile while serving.

Every figure is one the server printed itself (vLLM's "Model loading took ... seconds",
"Graph capturing finished in ... secs", "JIT kernel warmup finished in ...s", "init engine
(...) took ... s", "torch.compile took ... s in total"), so a cold start's record says
which step grew or shrank without a hand-made excerpt of the log. A step the log does not
mention is left out, never reported as 0.
"""

from __future__ import annotations

import ast
import re

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"

# name -> pattern whose one group is seconds; a step logged more than once (vLLM captures
# the target's graphs and then the draft's) is summed.
DURATIONS = {
    "model_loading_s": rf"Model loading took \S+ GiB memory and {_NUMBER} seconds",
    "torch_compile_s": rf"torch\.compile took {_NUMBER} s in total",
    "graph_capture_s": rf"Graph capturing finished in {_NUMBER} secs",
    "jit_warmup_s": rf"JIT kernel warmup finished in {_NUMBER}s",
    "init_engine_s": rf"init engine \(profile, create kv cache, warmup model\) took {_NUMBER} s",
}
_JIT_IN_SERVING = re.compile(r"Triton kernel JIT compilation during inference: (\w+)")
_SEEDED = re.compile(r"seeded AOT kernels from \S+: (\{[^}]*\})")


def parse(log_text: str) -> dict:
    """The start's steps found in ``log_text``: ``DURATIONS``' names with seconds,
    ``graph_captures`` (how many captures were summed), ``aot_seeded`` (the plugin's first
    count of AOT entries per part, e.g. ``{"triton": 54, ...}``) and
    ``jit_compiled_while_serving`` (kernel names, in the order vLLM's monitor logged them)."""
    out: dict = {}
    for name, pattern in DURATIONS.items():
        found = [float(m) for m in re.findall(pattern, log_text)]
        if found:
            out[name] = sum(found)
            if name == "graph_capture_s":
                out["graph_captures"] = len(found)
    seeded = _SEEDED.search(log_text)
    if seeded:
        out["aot_seeded"] = ast.literal_eval(seeded.group(1))
    compiled = _JIT_IN_SERVING.findall(log_text)
    if compiled:
        out["jit_compiled_while_serving"] = compiled
    return out


def summary(timeline: dict) -> str:
    """One line, e.g. ``model loading 21 s, graph capture 95 s (2), JIT warmup 90 s``."""
    labels = {
        "model_loading_s": "model loading",
        "torch_compile_s": "torch.compile",
        "graph_capture_s": "graph capture",
        "jit_warmup_s": "JIT warmup",
        "init_engine_s": "engine init in all",
    }
    parts = []
    for name, label in labels.items():
        if name in timeline:
            part = f"{label} {timeline[name]:.0f} s"
            if name == "graph_capture_s":
                part += f" ({timeline['graph_captures']} captures)"
            parts.append(part)
    if "aot_seeded" in timeline:
        parts.append(f"AOT entries seeded {timeline['aot_seeded']}")
    compiled = timeline.get("jit_compiled_while_serving")
    parts.append(f"Triton JIT while serving: {', '.join(compiled) if compiled else 'none logged'}")
    return "; ".join(parts)
