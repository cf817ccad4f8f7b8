"""benchmarks/e2e/record.py: wave records that travel off a GPU machine and merge back."""

import io
import json
import random
import re

import numpy as np
import pytest

from benchmarks.e2e import record

ENV = {
    "host": "a",
    "gpu": "NVIDIA H100 80GB HBM3",
    "torch": "2.14.0",
    "triton": "3.8.0",
    "vllm": "0.33.0",
}


def _run(rng: random.Random, lengths: dict[str, int], fp32: bool = True) -> dict:
    def value() -> float:
        x = -rng.expovariate(0.3)
        return float(np.float32(x)) if fp32 else x

    prompts = {
        name: {
            "prompt_sha256": f"sha-{name}",
            "logprobs": [value() for _ in range(n)],
            "top1": [rng.randrange(256) for _ in range(n)],
            "greedy": [rng.randrange(256) for _ in range(24)],
        }
        for name, n in lengths.items()
    }
    return {"schedule": "sequential", "seconds": 1.5, "prompts": prompts}


def _result(servers: list[str], seed: int = 0, env: dict = ENV, **kw) -> dict:
    rng = random.Random(seed)
    lengths = {"p-5": 4, "p-300": 299, "p-odd": 77}
    return {
        "phase": "correctness",
        "environment": dict(env),
        "runs": {
            s: {"sequential": _run(rng, lengths, **kw), "concurrent": _run(rng, lengths, **kw)}
            for s in servers
        },
        "servers": {
            s: {"ready_s": 200.0 + i, "argv": ["vllm", "serve"]} for i, s in enumerate(servers)
        },
        "throughput": {s: {"ttft_8k_s": 0.2} for s in servers if s.endswith("graphs")},
    }


def test_a_wave_comes_back_bit_for_bit():
    res = _result(["stock-eager", "ours-eager", "stock-graphs"])
    back = record.unpack(record.pack(res, ["stock-eager", "stock-graphs"]))
    assert back["runs"] == {s: res["runs"][s] for s in ("stock-eager", "stock-graphs")}
    assert set(back["servers"]) == {"stock-eager", "stock-graphs"}
    assert back["throughput"] == {"stock-graphs": {"ttft_8k_s": 0.2}}
    assert back["environment"] == ENV


def test_values_that_are_not_fp32_stay_exact():
    res = _result(["stock-eager"], fp32=False)
    back = record.unpack(record.pack(res, ["stock-eager"]))
    assert back["runs"]["stock-eager"] == res["runs"]["stock-eager"]
    with np.load(io.BytesIO(record.pack(res, ["stock-eager"]))) as z:
        assert z["stock-eager/sequential/logprobs"].dtype == np.float64


def test_nan_and_infinity_survive():
    res = _result(["s"])
    lp = res["runs"]["s"]["sequential"]["prompts"]["p-5"]["logprobs"]
    lp[0], lp[1] = float("nan"), float("-inf")
    back = record.unpack(record.pack(res, ["s"]))["runs"]["s"]["sequential"]["prompts"]["p-5"]
    assert np.isnan(back["logprobs"][0]) and back["logprobs"][1] == float("-inf")
    assert back["logprobs"][2:] == lp[2:]


def test_a_null_logprob_is_refused_naming_the_run():
    res = _result(["ours-eager"])
    res["runs"]["ours-eager"]["concurrent"]["prompts"]["p-odd"]["logprobs"][3] = None
    with pytest.raises(ValueError, match="ours-eager/concurrent: a logprob is null"):
        record.pack(res, ["ours-eager"])


def test_a_full_wave_fits_under_a_remote_machines_file_limit():
    """Three servers, five probe runs of the 32 prompts' 267,457 positions: the size the
    device machine lets a file come back at (16 MiB)."""
    rng = np.random.default_rng(0)
    n = 267_457
    names = [f"p{i:02d}" for i in range(32)]
    cuts = np.linspace(0, n, 33).astype(int)

    def run_of() -> dict:
        lp = (-rng.exponential(3.0, n)).astype(np.float32).astype(float).tolist()
        top = rng.integers(0, 256, n).tolist()
        return {
            "schedule": "x",
            "seconds": 1.0,
            "prompts": {
                name: {
                    "prompt_sha256": name,
                    "logprobs": lp[a:b],
                    "top1": top[a:b],
                    "greedy": [1] * 24,
                }
                for name, a, b in zip(names, cuts[:-1], cuts[1:], strict=True)
            },
        }

    res = {
        "environment": ENV,
        "servers": {},
        "throughput": {},
        "runs": {
            "stock-eager": {"sequential": run_of(), "concurrent": run_of()},
            "ours-eager": {"sequential": run_of(), "concurrent": run_of()},
            "control-L24-50pct": {"sequential": run_of()},
        },
    }
    data = record.pack(res, list(res["runs"]))
    assert len(data) < 16 * 2**20, record.size_mib(len(data))
    assert len(data) < len(json.dumps(res)) / 4  # what the record is for


def test_merge_puts_waves_side_by_side():
    eager = _result(["stock-eager", "ours-eager"], seed=1)
    graphs = _result(["stock-graphs", "ours-graphs"], seed=2, env={**ENV, "host": "b"})
    merged = record.merge([("wave-eager.npz", eager), ("wave-graphs.npz", graphs)])
    assert set(merged["runs"]) == {"stock-eager", "ours-eager", "stock-graphs", "ours-graphs"}
    assert merged["runs"]["ours-graphs"] == graphs["runs"]["ours-graphs"]
    assert set(merged["throughput"]) == {"stock-graphs", "ours-graphs"}
    assert [m["host"] for m in merged["merged_from"]] == ["a", "b"]


@pytest.mark.parametrize("field", record.SAME_ENVIRONMENT)
def test_merge_refuses_another_gpu_or_stack(field):
    a = _result(["stock-eager"])
    b = _result(["stock-graphs"], env={**ENV, field: "other"})
    with pytest.raises(ValueError, match=f"environment field '{field}' is 'other'"):
        record.merge([("a.npz", a), ("b.npz", b)])


def test_merge_refuses_a_server_recorded_twice():
    a = _result(["stock-eager", "ours-eager"], seed=1)
    b = _result(["stock-eager"], seed=2)
    with pytest.raises(ValueError, match=re.escape("'stock-eager' is in both a.npz and b.npz")):
        record.merge([("a.npz", a), ("b.npz", b)])


def test_a_file_of_another_kind_is_refused(tmp_path):
    path = tmp_path / "x.npz"
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.frombuffer(b'{"format": "other"}', dtype=np.uint8))
    path.write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="not a deepinfer-e2e-wave/1 file"):
        record.load(path)


def test_write_then_load_from_a_file(tmp_path):
    res = _result(["stock-eager"])
    n = record.write(tmp_path / "wave-eager.npz", res, ["stock-eager"])
    assert n == (tmp_path / "wave-eager.npz").stat().st_size
    assert not list(tmp_path.glob("*.partial"))
    assert record.load(tmp_path / "wave-eager.npz")["runs"] == res["runs"]
