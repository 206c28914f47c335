# Two commands do all the set-up: `make sweep` runs the main job, `make test` runs the tests.
# Both create (or refresh, when pyproject.toml changes) the virtual environment in .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tpbench-installed
# Installed only where no torch is present: the pinned CPU build, never a multi-GB CUDA wheel by accident.
TORCH_SPEC ?= torch==2.13.0
SUITE ?= suites/zero.toml
PYTEST_ARGS ?=

.PHONY: sweep smoke lint test test-all test-fast bench env clean-venv chromium

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	@# Holistic Trace Analysis is the reference the overlap numbers are checked against; its own
	@# requirements pull JupyterLab, which it does not need to analyse traces (its imports are in [test]).
	$(PY) -m pip install -q --no-deps HolisticTraceAnalysis==0.5.0
	@touch $(STAMP)

env: $(STAMP)

sweep: $(STAMP)
	$(VENV)/bin/tpbench sweep $(SUITE)

smoke: $(STAMP)
	$(VENV)/bin/tpbench sweep suites/smoke.toml

# ruff's lint rules and formatting, configured in pyproject.toml (`ruff format .` formats the tree).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Everything but the `slow` mark (a soak and long end-to-end runs), so that CI's 2-core machine stays
# within its time; `make test-all` runs those too.
test: $(STAMP) lint chromium
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

test-all: $(STAMP) lint chromium
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The unit tests only: none starts a rank process (see the `ranks` mark in tests/conftest.py).
test-fast: $(STAMP) lint
	$(VENV)/bin/pytest -m "not ranks and not slow" $(PYTEST_ARGS)

# The report's tests drive a real headless Chromium (Debian's package). Installed here when missing
# and we are root with apt-get (CI: a clean Debian machine); elsewhere those tests skip and say why.
chromium:
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

bench: $(STAMP)
	$(VENV)/bin/pytest tests/benchmarks --benchmark-enable --benchmark-only $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
