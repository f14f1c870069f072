# The two commands:  `make study` (run the whole study)  and  `make test` (run the tests).
# Both create or refresh the environment in .venv from this project's files first.
PY      ?= python3
VENV    ?= .venv
# torch: a machine that already has torch (the GPU host) keeps it; elsewhere this pin is installed
# (on the project's CI machine it is a CPU build; set TORCH_SPEC to choose another build).
TORCH_SPEC ?= torch==2.13.0
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: env study test lint clean gpu-test bench calls tune reproduce

env: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PY) -m venv --system-site-packages $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $(STAMP)

study: env
	$(BIN)/python -m nvfp4lib study

# one pytest-xdist worker per core; each compiled kernel's tests stay in one worker (--dist loadgroup)
TEST_WORKERS ?= auto
test: env
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

lint: env
	$(BIN)/ruff check nvfp4lib tests

# On the GPU machine (sm_90): the GPU suite, a benchmark run of the default kernel and its peers, the serving path's
# four call forms, and the tuning cache. Rows go to build/ unless RECORD=--record (then data/).
# GPU_PY=python3 runs them with a Python that already has the project's dependencies (the GPU host: no network, so
# no venv to build there). The GPU suite spreads over GPU_WORKERS processes (16: one per core of the H100 host)
# where pytest-xdist is installed, each config's tests in one process (compiling is most of its time);
# NVFP4LIB_GPU_FULL=1 widens it to every config x every problem x both input modes.
RECORD ?=
ITERS ?= 50
GPU_PY ?= $(BIN)/python
GPU_ENV := $(if $(filter $(BIN)/python,$(GPU_PY)),env,)
# GPU_TESTS picks part of the suite (one file, or a -k expression), for machines that limit a command's time
GPU_TESTS ?= tests/gpu
GPU_WORKERS ?= 16
# GPU_TIMEOUT=<seconds> stops the run with SIGINT: pytest then still reports the failures it has (a plain kill loses them)
GPU_TIMEOUT ?=
# GPU_ARGS: more pytest options (e.g. -rA to list what passed before a GPU_TIMEOUT stop). NVFP4LIB_TEST_TIMES=FILE in
# the environment appends each test phase's seconds to FILE as it ends (a run cut off still says what took its time);
# NVFP4LIB_AOT=DIR loads kernels compiled without a GPU (docs/aot.md)
GPU_ARGS ?=
# GPU_PART=i/n runs part i of n: the parts hold every GPU test once and keep each xdist group (one compiled kernel's
# tests) whole. The whole suite took ~30 minutes at 16 workers on the H100 host, compiling most of it: n=5 aims each
# part at a 10-minute command limit. With each worker's torch threads its share of the cores (tests/conftest.py) and
# the kernels built ahead (NVFP4LIB_AOT), 435 of its 587 tests ran in 218 s on the H200 host (2026-11-28)
GPU_PART ?=
gpu-test: $(GPU_ENV)
	$(if $(GPU_PART),NVFP4LIB_GPU_PART=$(GPU_PART) ,)$(if $(GPU_TIMEOUT),timeout -s INT $(GPU_TIMEOUT) ,)$(GPU_PY) -m pytest -q -rfE $(GPU_ARGS) $(GPU_TESTS) \
	  $$($(GPU_PY) -c "import xdist; print('-n $(GPU_WORKERS) --dist loadgroup')" 2>/dev/null)

bench: $(GPU_ENV)
	$(GPU_PY) -m nvfp4lib bench --iters $(ITERS) $(RECORD)

calls: $(GPU_ENV)
	$(GPU_PY) -m nvfp4lib calls --suite benchmark --suite dual --mode uniform $(RECORD)

tune: $(GPU_ENV)
	$(GPU_PY) -m nvfp4lib tune --suite benchmark --suite dual

# Rerun one round the notebooks show (`python -m nvfp4lib experiment --list` names them): on the GPU machine it
# benchmarks the round's configs; a round whose code left the package prints the commit that had it and how to rerun it.
ROUND ?=
reproduce: env
	@test -n "$(ROUND)" || { echo "name a round: make reproduce ROUND=round1 (rounds: python -m nvfp4lib experiment --list)"; exit 2; }
	$(BIN)/python -m nvfp4lib experiment $(ROUND) $(RECORD)

clean:
	rm -rf build .pytest_cache
