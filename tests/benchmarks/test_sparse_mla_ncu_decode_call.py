"""benchmarks.sparse_mla_ncu_decode_call: its case names and its refusal without a GPU (the calls
themselves need a CUDA GPU)."""

import argparse
import re

import pytest

from benchmarks import sparse_mla_ncu_decode_call as ndc


def test_case_names_parse():
    assert ndc.parse_case("T256_H64_throughput") == (256, 64, "throughput")
    assert ndc.parse_case("T1_H8_latency") == (1, 8, "latency")


@pytest.mark.parametrize("bad", ["T256_H12_latency", "T256_H64", "H64_T256_latency", "T_H64_x"])
def test_bad_case_names_say_the_form(bad):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("T<tokens>_H<8|16|32|64>")):
        ndc.parse_case(bad)


def test_refuses_without_a_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        ndc.main(["T256_H64_throughput"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {}),
        (["--qk-registers"], {"QK_REGISTERS": 1}),
        (["--head-tiles", "4", "--qk-registers"], {"HEAD_TILES": 4, "QK_REGISTERS": 1}),
    ],
)
def test_switches_hold_for_the_calls_and_are_restored(monkeypatch, argv, expected):
    """The profiled calls run under the switches named, and arch.py is as shipped afterwards."""
    import torch

    import benchmarks.microbench_sparse_mla as mb
    from benchmarks.sparse_mla_decode_config import CONFIG
    from deepinfer_sm80 import arch

    shipped = arch.KERNEL_CONFIGS[CONFIG].constexpr_dict()
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(mb, "decode_inputs", lambda *a: object())
    monkeypatch.setattr(
        mb, "run_decode", lambda *a: seen.append(arch.KERNEL_CONFIGS[CONFIG].constexpr_dict())
    )
    ndc.main(["T4_H64_latency", *argv])
    assert seen == [{**shipped, **expected}] * 2
    assert arch.KERNEL_CONFIGS[CONFIG].constexpr_dict() == shipped
