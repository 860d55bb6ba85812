# pdopt: two quick-start commands (make demo, make test) and the benchmarks (make bench).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck warm bench experiments experiments-quick clean install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The install compiles the simulator's compiled engine into numba's cache (~3 min, once), so a
# first compiled run (make demo's plan verification) loads it in seconds instead of stalling.
WARM := $(BIN)/python -m pdopt.sim._compiled

# A dev install (make test's) already holds the package: then only the warm step runs.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@if [ $(STAMP) -nt pyproject.toml ]; then echo "pdopt already installed (dev)"; else $(BIN)/pip install -q -e .; fi
	$(WARM)
	touch $@

# torch only from the CPU build when it is available as an exact pin; the harness tests skip without it.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[dev]"
	-$(BIN)/pip install -q "torch==2.13.0" || echo "torch 2.13.0 not installable here: calibration harness tests will skip"
	touch $@

install: $(VENV)/.installed

# The main job: size a cluster for ShareGPT-like traffic over three GPU types and TP degrees,
# verify it by simulation (add --compare-modes for colocated and EcoServe deployments beside it).
demo: $(VENV)/.installed
	$(BIN)/pdopt plan --profile profiles/v100-32gb_qwen2.5-7b_roofline.csv --workload sharegpt \
		--rate 12 --ttft-slo 1.0 --tpot-slo 0.1 --gpus V100-32GB=16,A100-80GB=8,H100-SXM=8

warm: $(STAMP)
	$(WARM)

LINT      := $(BIN)/ruff check pdopt tests calibration benchmarks
TYPECHECK := $(BIN)/mypy
lint: $(STAMP)
	$(LINT)

typecheck: $(STAMP)
	$(TYPECHECK)

# The suite on every CPU this process may use (pytest-xdist, JOBS workers), after ruff and mypy.
# --dist loadfile: a file's tests run on one worker, so a module-scoped fixture (a CLI run, the
# README blocks' outcomes) is built once. (loadgroup's xdist_group marks do nothing with
# pytest 9.2 and pytest-xdist 3.8: the worker renames item._nodeid, which pytest 9 no longer reads.)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# The engine's compile (WARM: one CPU, ~3 min on an empty numba cache, seconds after) runs beside
# ruff and mypy; the tests start when all three have passed.
test: $(STAMP)
	@$(WARM) & warm=$$!; $(LINT) && $(TYPECHECK); checks=$$?; wait $$warm && exit $$checks
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile

# BENCH_FLAGS: --quick (a tenth of the sizes), --only NAME, --full (the whole 200-trial Phasor study)
BENCH_FLAGS ?=
bench: warm
	$(BIN)/python -m benchmarks.run --out bench-results $(BENCH_FLAGS)

# The seed papers' figures and tables into results/ (CSV + PNG) and RESULTS.md (~18 min on 2 cores).
# TRACES: the folder holding azure_llm_2023/AzureLLMInferenceTrace_code.csv (Arrow is skipped without it).
# DASK: run the simulations on a Dask cluster: DASK=local (one LocalCluster here, DASK_WORKERS
# processes, default one per CPU) or DASK=tcp://HOST:8786; the CSVs are the serial run's.
TRACES ?= ../shared/data/traces
DASK ?=
DASK_WORKERS ?=
DASK_FLAGS := $(if $(DASK),--dask $(DASK)) $(if $(DASK_WORKERS),--dask-workers $(DASK_WORKERS))
experiments: warm
	$(BIN)/python experiments/run_all.py --out results --traces $(TRACES) $(DASK_FLAGS)

experiments-quick: warm
	$(BIN)/python experiments/run_all.py --quick --out results/quick --report results/quick/RESULTS.md --traces $(TRACES) $(DASK_FLAGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
