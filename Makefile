# Two entry points (see README): `make repro` runs the pipeline, `make test` the test suite.
# Both create .venv and install bertrace from this repo's own files, pinned by constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

# Offline machines (this project's build and CI machines) reach hub datasets through the
# mirror of ../shared/data; elsewhere the hub is used. Override with BERTRACE_HUB_MIRROR=...
ifneq ($(wildcard ../shared/data/README.md),)
export BERTRACE_HUB_MIRROR ?= mirrors/shared-data.yaml
endif

.PHONY: install repro exps test test-fast lint bench bench-data learning-curve team-up team-down clean-venv

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt "$(TORCH)"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test,team]"   # team: the S3 remote + tracking server tests
	touch $@

install: $(BIN)/.installed

# `make repro PROFILE=enwiki`: the pipeline with profiles/enwiki.yaml's params, as a DVC experiment.
repro: install
	$(BIN)/python -m stages.cli check-tracking
ifdef PROFILE
	PATH="$(abspath $(BIN)):$$PATH" eval dvc exp run $$($(BIN)/python -m stages.cli.profile $(PROFILE))
else
	PATH="$(abspath $(BIN)):$$PATH" dvc repro
endif

# Experiments side by side in 160 columns: the params that differ and the metrics (tests/e2e/test_daily_loop.py).
# A sweep: `dvc exp run --queue -S finetune.lr=1e-4 -S finetune.threads=1` (once per point; threads = cores / -j),
# `dvc queue start -j 2`, then `make exps`.
exps: install
	PATH="$(abspath $(BIN)):$$PATH" dvc exp show --no-pager --only-changed --drop 'Created|Executor|.*/' --keep 'dev_|test_'

# SST-2 dev accuracy vs pre-training steps from data/pretrain/snapshots (pretrain.snapshot_steps).
learning-curve: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m stages.cli.learning_curve

# Two pytest workers, a test file each (--dist loadfile: a file's module fixtures are built once);
# tests/conftest.py gives each worker, and the stages it runs, one torch thread. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST = PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: install
	$(PYTEST)

test-fast: install
	$(PYTEST) -m "not slow"

# One formatter and linter ([tool.ruff] in pyproject.toml); `ruff format .` and `ruff check --fix .` apply them.
lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

# Data-stage benchmarks (BENCHMARKS.md). The peer is Google's create_pretraining_data.py, run
# from a checkout of google-research/bert (never copied here) with a Python that has tensorflow.
GOOGLE_BERT ?= ../peer/bert
PEER_PYTHON ?= ../bench-venv/bin/python
bench: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/run_all.py --google-bert $(GOOGLE_BERT) --peer-python $(PEER_PYTHON)

# The data half at Wikipedia scale (BENCHMARKS.md "Wikipedia scale"): 0.1 and 1 GB of synthetic Wikipedia, ~15 min
# on 2 cores; SIZES="2" for the memory check at 2 GB.
SIZES ?= 0.1 1
bench-data: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python bench/bench_data_half.py --sizes $(SIZES)

# A team's servers on 127.0.0.1 for a laptop trial (docs/team.md): SeaweedFS (S3: the DVC remote and
# MLflow's artifacts), PostgreSQL and an MLflow tracking server. Prints the variables to export.
TEAM_STATE ?= .team
team-up: install
	$(BIN)/python scripts/team.py up --state $(TEAM_STATE)

team-down:
	$(BIN)/python scripts/team.py down --state $(TEAM_STATE)

clean-venv:
	rm -rf $(VENV)
