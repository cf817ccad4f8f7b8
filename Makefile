# DeepInfer-SM80 -- developer entry points. `make help` lists them.
#
# `make test` builds its own environment in .venv/ (pinned to what vLLM 0.33.0 runs)
# and runs the CPU tiers. `make test-gpu` and `make bench` never install anything:
# they use whatever interpreter PYTHON names, with its own torch and triton.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

HOST_PYTHON ?= python3
# The light host install for the `deepinfer` command alone (make cli): no torch, no vLLM.
CLI_VENV := .venv-cli
CLI_STAMP := $(CLI_VENV)/.deps-stamp
VENV := .venv
VENV_BIN := $(VENV)/bin
VENV_PY := $(VENV_BIN)/python
STAMP := $(VENV)/.deps-stamp
PYTHON ?= python3
PYTEST_ARGS ?=
# make test runs the CPU tiers on this many processes, each test file whole in one of them
# (its module fixtures built once). Each holds vLLM and torch: up to about 2 GB of memory.
TEST_WORKERS ?= 2

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
ifeq ($(origin TOPOLOGY),undefined)
TOPOLOGY := $(or $(ENV_TOPOLOGY),tp2-pp3)
endif
# TOPOLOGY, GPU and NODE_ENV reach shell commands: each must be a plain name (or path),
# checked on its unexpanded text ($(value ...)) so that neither make nor a shell ever
# expands what was given.
NAME_CHARS := a b c d e f g h i j k l m n o p q r s t u v w x y z \
	A B C D E F G H I J K L M N O P Q R S T U V W X Y Z 0 1 2 3 4 5 6 7 8 9 - _ .
without_chars = $(if $(2),$(call without_chars,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,$(words $(2)),$(2))),$(1))
# $(call plain_name,VAR,extra allowed chars): empty when VAR's text is one safe word.
plain_name = $(if $(filter 1,$(words $(value $(1)))),$(if $(filter -%,$(value $(1))),bad,$(call without_chars,$(value $(1)),$(NAME_CHARS) $(2))),bad)
ifneq ($(call plain_name,TOPOLOGY),)
$(error TOPOLOGY must be a topology name (letters, digits, '-', '_', '.'; see configs/topologies/), got: $(value TOPOLOGY))
endif
ifneq ($(origin GPU),undefined)
ifneq ($(call plain_name,GPU),)
$(error GPU must be a GPU kind such as A100-80GB or A100-SXM4-80GB, got: $(value GPU))
endif
endif
ifneq ($(origin NODE_ENV),undefined)
ifneq ($(call plain_name,NODE_ENV,/),)
$(error NODE_ENV must be a path of letters, digits, '-', '_', '.', '/', got: $(value NODE_ENV))
endif
endif
# The host-side `deepinfer` that reads topology files for make: the light install
# (make cli), else the test environment's (make setup). With neither, the targets that
# need it build the light one first (HOST_CLI_DEPS); nothing else looks for it.
HOST_CLIS := $(wildcard $(CLI_VENV)/bin/deepinfer $(VENV_BIN)/deepinfer)
HOST_DEEPINFER := $(firstword $(HOST_CLIS) $(CLI_VENV)/bin/deepinfer)
HOST_CLI_DEPS := $(if $(HOST_CLIS),,cli)
# GPUs per node to reserve: `deepinfer gpus TOPOLOGY` (the count the validator reads).
# Recursive and expanded only by the targets that reserve GPUs (up, weights,
# print-gpu-count), and then once: the first use replaces it with its value.
GPU_COUNT ?= $(eval GPU_COUNT := $$(call topology_gpus))$(GPU_COUNT)
topology_gpus = $(or $(shell if test -x $(HOST_DEEPINFER); then $(HOST_DEEPINFER) gpus $(TOPOLOGY); \
	else echo "make: $(HOST_DEEPINFER) is missing: \`make cli\` installs it" >&2; fi),$(error \
	no GPU count for TOPOLOGY=$(TOPOLOGY) (the reason is above); fix the topology, run \
	`make cli` for the host-side deepinfer, or give GPU_COUNT=N))
COMPOSE ?= docker compose
# `make wait`: seconds to wait for readiness (the compose healthcheck's start period).
WAIT ?= 5400
export IMAGE TOPOLOGY

.PHONY: help setup cli test test-image lint image wheelhouse base-image up up-node down logs monitoring health wait smoke e2e plan \
	weights bench charts test-gpu test-oracles clean

help:
	@echo "setup       create .venv/: vllm==$(VLLM_VERSION), torch $(TORCH_VERSION), triton $(TRITON_VERSION), tilelang $(TILELANG_VERSION)"
	@echo "cli         create .venv-cli/: the deepinfer command alone (pydantic, PyYAML; no torch)"
	@echo "test        CPU tiers: interpreter kernel tests, sm80/sm86 AOT fitness, vLLM oracles"
	@echo "test-image  build the image, start it without GPUs via compose, check it from outside"
	@echo "lint        ruff"
	@echo "image       build $(IMAGE) (OFFLINE=1: debootstrap base; EXTRA_CA_DIR, WHEELHOUSE)"
	@echo "wheelhouse  download the image's wheels to .wheelhouse/ (feeds make image WHEELHOUSE=...)"
	@echo "base-image  the offline Debian base image, from Debian packages (debootstrap)"
	@echo "smoke       one GPU: write the smoke checkpoint, serve it (topology smoke), check --ready"
	@echo "up          start the server for TOPOLOGY=$(TOPOLOGY) in the background (its GPUs: deepinfer gpus)"
	@echo "up-node     multi-node: start this node's role (NODE_ENV=node1.env make up-node)"
	@echo "down        stop it"
	@echo "logs        follow its logs"
	@echo "monitoring  Prometheus + Grafana (compose profile observability): dashboards and alerts"
	@echo "health      readiness from the host: container state, models list, one completion"
	@echo "wait        health, retried until ready or WAIT=$(WAIT) s pass; stops at once if the container dies"
	@echo "plan        memory and KV capacity of TOPOLOGY per stage (GPU=A100-80GB to change GPU)"
	@echo "weights     download the checkpoint into the Hugging Face cache"
	@echo "bench       microbenchmarks on a CUDA GPU -> benchmarks/results/ (PYTHON=...)"
	@echo "charts      PNG charts from benchmarks/results/ (PYTHON=... with matplotlib)"
	@echo "e2e         stock vLLM vs the overlay, served end to end on this GPU (PYTHON=... with vLLM)"
	@echo "test-gpu    full-size kernel tests on a CUDA GPU (PYTHON=..., installs nothing)"
	@echo "test-oracles vLLM 0.33.0's own kernels vs ours on a CUDA GPU (PYTHON=... with vLLM)"

$(STAMP): requirements/test.txt requirements/image.txt requirements/host.txt overlay/pyproject.toml
	@$(HOST_PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ needed, got " + sys.version' 
	test -x $(VENV_PY) || $(HOST_PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --upgrade pip
	$(VENV_PY) -m pip install --quiet -r requirements/test.txt
	$(VENV_PY) -m pip install --quiet --no-deps -e overlay
	touch $(STAMP)

setup: $(STAMP)

$(CLI_STAMP): requirements/cli.txt overlay/pyproject.toml
	@$(HOST_PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ needed, got " + sys.version'
	test -x $(CLI_VENV)/bin/python || $(HOST_PYTHON) -m venv $(CLI_VENV)
	$(CLI_VENV)/bin/python -m pip install --quiet -r requirements/cli.txt
	$(CLI_VENV)/bin/python -m pip install --quiet --no-deps -e overlay
	touch $(CLI_STAMP)

cli: $(CLI_STAMP)

test: setup
	$(CPU_ENV) $(VENV_PY) -m pytest -m "not gpu and not image and not e2e" \
		-n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-image: setup image
	$(VENV_PY) -m pytest tests/image -m image $(PYTEST_ARGS)

image:
	IMAGE=$(IMAGE) BASE_IMAGE=$(BASE_IMAGE) OFFLINE=$(OFFLINE) EXTRA_CA_DIR=$(EXTRA_CA_DIR) \
		WHEELHOUSE=$(WHEELHOUSE) scripts/build-image

wheelhouse: setup
	$(VENV_PY) -m pip download --quiet -r requirements/image.txt -d .wheelhouse

base-image:
	scripts/build-base-image

up: $(HOST_CLI_DEPS)
	@test -n "$(GPU_COUNT)" || { echo "GPU_COUNT is empty: leave it unset (make asks deepinfer) or give a number"; exit 2; }
	@# A refusal stops in the one-shot deepinfer-check service: show why, exit with its code.
	GPU_COUNT=$(GPU_COUNT) $(COMPOSE) up -d || { $(COMPOSE) logs --no-log-prefix deepinfer-check >&2; \
		exit "$$($(COMPOSE) ps -a --format '{{.ExitCode}}' deepinfer-check | grep -v '^0$$' || echo 1)"; }
	@echo "starting $(TOPOLOGY) on $(GPU_COUNT) GPUs; first start takes long: make logs, make health"

# One GPU, the smoke checkpoint (random weights, the real attention geometry): proves the
# image, plugin, kernels and OpenAI server in minutes, before the ~500 GB download.
SMOKE_MODEL := /home/deepinfer/.cache/huggingface/deepinfer-smoke-v41
smoke: cli
	TOPOLOGY=smoke GPU_COUNT=1 $(COMPOSE) run --rm --no-deps --entrypoint sh deepinfer -c \
		'test -f $(SMOKE_MODEL)/smoke_model.json || deepinfer smoke-model $(SMOKE_MODEL)'
	env -u GPU_COUNT $(MAKE) --no-print-directory up TOPOLOGY=smoke SERVED_MODEL_NAME=deepinfer-smoke
	$(CLI_VENV)/bin/deepinfer health --ready --no-known-answer --service deepinfer \
		--served-model-name deepinfer-smoke --wait 1800

down:
	$(COMPOSE) --profile observability down

up-node:
	@test -f "$(NODE_ENV)" || { echo "NODE_ENV=path/to/nodeN.env (see configs/nodes/)"; exit 2; }
	@# The node's env file is the source of truth: drop the single-node values make exports.
	env -u TOPOLOGY -u GPU_COUNT $(COMPOSE) -f compose.multinode.yaml --env-file $(NODE_ENV) up -d \
		|| { $(COMPOSE) -f compose.multinode.yaml logs --no-log-prefix deepinfer-check >&2; exit 2; }

monitoring:
	$(COMPOSE) --profile observability up -d prometheus grafana
	@echo "Grafana on http://127.0.0.1:3000 (dashboard DeepInfer-SM80), Prometheus on :9090"

logs:
	$(COMPOSE) logs -f

# From the host, through the Docker engine: the container's state, then the published port.
health: cli
	$(CLI_VENV)/bin/deepinfer health --ready --service deepinfer

wait: cli
	$(CLI_VENV)/bin/deepinfer health --ready --service deepinfer --wait $(WAIT)

plan: cli
	$(CLI_VENV)/bin/deepinfer plan $(TOPOLOGY) $(if $(GPU),--gpu $(GPU))

weights: $(HOST_CLI_DEPS)
	GPU_COUNT=$(GPU_COUNT) $(COMPOSE) run --rm --entrypoint deepinfer deepinfer weights download

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Every test on the GPU but the image and AOT tiers (tests/image is never collected: it
# needs Docker, not a GPU; nor tests/deploy: the host CLI's tests need its requirements,
# the Docker SDK among them, and no GPU); the vllm tier too where vLLM imports
# (DEEPINFER_REQUIRE_VLLM=1 makes its absence a failure). The tiers section at the end
# says what ran.
test-gpu:
	@if [ "$${DEEPINFER_REQUIRE_VLLM:-}" = 1 ] || $(PYTHON) -c 'import vllm' >/dev/null 2>&1; then \
		marks="not aot and not image and not e2e"; echo "test-gpu: tiers gpu, plain and vllm (vLLM imports or is required)"; \
	else \
		marks="not aot and not image and not vllm and not e2e"; echo "test-gpu: tiers gpu and plain; vllm not run: vLLM does not import with $(PYTHON)"; \
	fi; \
	DEEPINFER_TEST_DEVICE=cuda PYTHONPATH=overlay:.:$${PYTHONPATH:-} $(PYTHON) -m pytest --ignore=tests/image --ignore=tests/deploy -m "$$marks" $(PYTEST_ARGS)

# vLLM 0.33.0's own kernels (FlashMLA, DeepGEMM, its TileLang mHC, its cache writers and
# gathers) against ours on the same inputs, on this CUDA GPU with vLLM importable from
# PYTHON (required: without it the run fails). Parts a GPU cannot run (FlashMLA below
# sm_90, say) skip as not applicable. test-gpu runs these too where vLLM imports.
test-oracles:
	DEEPINFER_TEST_DEVICE=cuda DEEPINFER_REQUIRE_VLLM=1 PYTHONPATH=overlay:.:$${PYTHONPATH:-} $(PYTHON) -m pytest tests/ops/test_gpu_oracles.py $(PYTEST_ARGS)

# The same small checkpoint served by vLLM's own path and by ours, on this CUDA GPU with
# vLLM 0.33.0 importable from PYTHON (benchmarks/e2e/README.md; about 20 minutes).
e2e:
	DEEPINFER_TEST_DEVICE=cuda PYTHONPATH=overlay:.:$${PYTHONPATH:-} $(PYTHON) -m pytest tests/e2e -m e2e $(PYTEST_ARGS)

bench:
	PYTHONPATH=overlay:.:$${PYTHONPATH:-} $(PYTHON) -m benchmarks.run_all

charts:
	PYTHONPATH=overlay:.:$${PYTHONPATH:-} $(PYTHON) -m benchmarks.generate_charts

clean:
	rm -rf $(VENV) $(CLI_VENV) .pytest_cache .ruff_cache

# Used by tests/image: the GPU count make would reserve for TOPOLOGY.
print-gpu-count: $(HOST_CLI_DEPS)
	@echo $(GPU_COUNT)
