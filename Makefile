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

# Versions the image and the test environment pin (requirements/image.txt holds them;
# these name the image and show in `make help`).
VLLM_VERSION := 0.33.0
TORCH_VERSION := 2.14.0
TRITON_VERSION := 3.8.0
TILELANG_VERSION := 0.1.12
IMAGE ?= deepinfer-sm80:$(VLLM_VERSION)
# The topology: TOPOLOGY=pp6 make up, else TOPOLOGY= in .env, else the default.
ENV_TOPOLOGY := $(shell sed -n 's/^TOPOLOGY=//p' .env 2>/dev/null | tail -1)
TOPOLOGY ?= $(or $(ENV_TOPOLOGY),tp2-pp3)
# GPUs to reserve: read from the topology file (tests check every shipped file's form).
GPU_COUNT ?= $(shell sed -n 's/^gpus: *{ *count: *\([0-9]*\).*/\1/p' configs/topologies/$(TOPOLOGY).yaml 2>/dev/null)
COMPOSE ?= docker compose
export IMAGE TOPOLOGY GPU_COUNT

.PHONY: help setup test test-image lint image wheelhouse base-image up up-node down logs monitoring health plan \
	weights bench charts test-gpu clean

help:
	@echo "setup       create .venv/: vllm==$(VLLM_VERSION), torch $(TORCH_VERSION), triton $(TRITON_VERSION), tilelang $(TILELANG_VERSION)"
	@echo "test        CPU tiers: interpreter kernel tests, sm80/sm86 AOT fitness, vLLM oracles"
	@echo "test-image  build the image, start it without GPUs via compose, check it from outside"
	@echo "lint        ruff"
	@echo "image       build $(IMAGE) (OFFLINE=1: debootstrap base; EXTRA_CA_DIR, WHEELHOUSE)"
	@echo "wheelhouse  download the image's wheels to .wheelhouse/ (feeds make image WHEELHOUSE=...)"
	@echo "base-image  the offline Debian base image, from Debian packages (debootstrap)"
	@echo "up          start the server for TOPOLOGY=$(TOPOLOGY) ($(GPU_COUNT) GPUs) in the background"
	@echo "up-node     multi-node: start this node's role (NODE_ENV=node1.env make up-node)"
	@echo "down        stop it"
	@echo "logs        follow its logs"
	@echo "monitoring  Prometheus + Grafana (compose profile observability): dashboards and alerts"
	@echo "health      end-to-end readiness check (models list + one completion)"
	@echo "plan        memory and KV capacity of TOPOLOGY per stage (GPU=A100-80GB to change GPU)"
	@echo "weights     download the checkpoint into the Hugging Face cache"
	@echo "bench       microbenchmarks on a CUDA GPU -> benchmarks/results/ (PYTHON=...)"
	@echo "charts      PNG charts from benchmarks/results/ (PYTHON=... with matplotlib)"
	@echo "test-gpu    full-size kernel tests on a CUDA GPU (PYTHON=..., installs nothing)"

$(STAMP): requirements/test.txt requirements/image.txt overlay/pyproject.toml
	@$(HOST_PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ needed, got " + sys.version' 
	test -x $(VENV_PY) || $(HOST_PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --upgrade pip
	$(VENV_PY) -m pip install --quiet -r requirements/test.txt
	$(VENV_PY) -m pip install --quiet --no-deps -e overlay
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(CPU_ENV) $(VENV_PY) -m pytest -m "not gpu and not image" $(PYTEST_ARGS)

test-image: setup image
	$(VENV_PY) -m pytest tests/image -m image $(PYTEST_ARGS)

image:
	IMAGE=$(IMAGE) BASE_IMAGE=$(BASE_IMAGE) OFFLINE=$(OFFLINE) EXTRA_CA_DIR=$(EXTRA_CA_DIR) \
		WHEELHOUSE=$(WHEELHOUSE) scripts/build-image

wheelhouse: setup
	$(VENV_PY) -m pip download --quiet -r requirements/image.txt -d .wheelhouse

base-image:
	scripts/build-base-image

up:
	@test -n "$(GPU_COUNT)" || { echo "unknown topology $(TOPOLOGY): see configs/topologies/"; exit 2; }
	$(COMPOSE) up -d
	@echo "starting $(TOPOLOGY) on $(GPU_COUNT) GPUs; first start takes long: make logs, make health"

down:
	$(COMPOSE) --profile observability down

up-node:
	@test -f "$(NODE_ENV)" || { echo "NODE_ENV=path/to/nodeN.env (see configs/nodes/)"; exit 2; }
	@# The node's env file is the source of truth: drop the single-node values make exports.
	env -u TOPOLOGY -u GPU_COUNT $(COMPOSE) -f compose.multinode.yaml --env-file $(NODE_ENV) up -d

monitoring:
	$(COMPOSE) --profile observability up -d prometheus grafana
	@echo "Grafana on http://127.0.0.1:3000 (dashboard DeepInfer-SM80), Prometheus on :9090"

logs:
	$(COMPOSE) logs -f

health:
	$(COMPOSE) exec deepinfer deepinfer health --ready

plan: setup
	$(VENV)/bin/deepinfer plan $(TOPOLOGY) $(if $(GPU),--gpu $(GPU))

weights:
	$(COMPOSE) run --rm --entrypoint deepinfer deepinfer weights download

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

# Used by tests/image: the GPU count make would reserve for TOPOLOGY.
print-gpu-count:
	@echo $(GPU_COUNT)
