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
