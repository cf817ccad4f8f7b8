"""Test tiers and shared fixtures.

Without a usable CUDA device (or with ``DEEPINFER_TEST_DEVICE=cpu``) the kernels run
under Triton's interpreter on CPU tensors: ``TRITON_INTERPRET=1`` and
``CUDA_VISIBLE_DEVICES=`` (set, empty, which also lets vLLM's Triton kernels run as
oracles) must be in place before Triton is imported, hence at the top of this file.
``make test-gpu`` sets ``DEEPINFER_TEST_DEVICE=cuda``: kernels compile for the GPU and
the ``gpu``-marked full-size cases run.
"""

import os

_WANT = os.environ.get("DEEPINFER_TEST_DEVICE", "").lower()
if _WANT != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import pytest
import torch

ON_GPU = _WANT == "cuda"
if ON_GPU and not torch.cuda.is_available():
    raise RuntimeError(
        "DEEPINFER_TEST_DEVICE=cuda but torch sees no CUDA device; run `make test` for the "
        "CPU tiers"
    )
if ON_GPU:
    from deepinfer_sm80.testing import ampere_ptx

    ampere_ptx.enable_if_requested()  # DEEPINFER_AMPERE_PTX=1: Ampere lowering via PTX JIT


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if ON_GPU else "cpu")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="full-size case: needs DEEPINFER_TEST_DEVICE=cuda")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)
