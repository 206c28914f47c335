# Two commands do all the set-up: `make sweep` runs the main job, `make test` runs the tests.
# Both create (or refresh, when pyproject.toml changes) the virtual environment in .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tpbench-installed
# Installed only where no torch is present: the pinned CPU build, never a multi-GB CUDA wheel by accident.
TORCH_SPEC ?= torch==2.13.0
SUITE ?= suites/zero.toml
PYTEST_ARGS ?=

.PHONY: sweep smoke test bench env clean-venv

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

env: $(STAMP)

sweep: $(STAMP)
	$(VENV)/bin/tpbench sweep $(SUITE)

smoke: $(STAMP)
	$(VENV)/bin/tpbench sweep suites/smoke.toml

test: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/pytest tests/benchmarks --benchmark-enable --benchmark-only $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
