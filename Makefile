# DeepInfer-SM80 -- developer entry points. `make help` lists them.
#
# `make test` builds its own environment in .venv/ (pinned to what vLLM 0.33.0 runs)
# and runs the CPU tiers. `make test-gpu` and `make bench` never install anything:
# they use whatever interpreter PYTHON names, with its own torch and triton.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

HOST_PYTHON ?= python3
VENV := .venv
VENV_PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-stamp
PYTHON ?= python3
PYTEST_ARGS ?=

# The CPU tiers: kernels under the Triton interpreter, vLLM's kernels as oracles.
CPU_ENV := TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= DEEPINFER_REQUIRE_VLLM=1

.PHONY: help setup test lint test-gpu bench charts clean

help:
	@echo "setup     create .venv/ with vllm==0.33.0, torch 2.14.0, triton 3.8.0, tilelang 0.1.12"
	@echo "test      CPU tiers: interpreter kernel tests, sm80/sm86 AOT fitness, vLLM oracles"
	@echo "lint      ruff"
	@echo "test-gpu  full-size kernel tests on a CUDA GPU (PYTHON=..., installs nothing)"
	@echo "bench     microbenchmarks on a CUDA GPU -> benchmarks/results/ (PYTHON=...)"
	@echo "charts    PNG charts from benchmarks/results/ (PYTHON=... with matplotlib)"

$(STAMP): requirements/test.txt overlay/pyproject.toml
	@$(HOST_PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ needed, got " + sys.version' 
	test -x $(VENV_PY) || $(HOST_PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --upgrade pip
	$(VENV_PY) -m pip install --quiet -r requirements/test.txt
	$(VENV_PY) -m pip install --quiet --no-deps -e overlay
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(CPU_ENV) $(VENV_PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test-gpu:
	DEEPINFER_TEST_DEVICE=cuda PYTHONPATH=overlay $(PYTHON) -m pytest -m "not vllm and not aot" $(PYTEST_ARGS)

bench:
	PYTHONPATH=overlay:. $(PYTHON) -m benchmarks.run_all

charts:
	PYTHONPATH=overlay:. $(PYTHON) -m benchmarks.generate_charts

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
