# One-command install, tests and demo. See BUILD.md for why TFF is installed in two steps.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tfbfl-installed

.PHONY: install check-install lint test demo bench clean-venv

install: $(STAMP)

# Re-runs only when the pins or the package metadata change (idempotent).
$(STAMP): requirements/pins.txt setup.cfg pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements/pins.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps google-vizier==0.1.11 tensorflow-federated==0.87.0
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

check-install: install
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m tfbfl.runtime

# The lint gate (ruff, pyflakes' rules; configured in pyproject.toml), before the tests.
RUFF := ruff==0.8.6
lint: install
	@$(PY) -m ruff --version 2>/dev/null | grep -q "$(subst ==, ,$(RUFF))" || \
	  $(PY) -m pip install -q --disable-pip-version-check $(RUFF)
	$(PY) -m ruff check tfbfl reproduction launchers benchmarks tests

# Two pytest-xdist workers, one test module each at a time (module fixtures run once),
# each TensorFlow (and every launcher it starts) with one intra-op and one inter-op
# thread: the two workers already fill the two cores (docs/tests.md#time).
# `make test TEST_WORKERS=0 TEST_TF_THREADS=` runs serially with TensorFlow's own
# thread counts.
TEST_WORKERS ?= 2
TEST_TF_THREADS ?= 1
TF_THREADS_ENV := $(if $(TEST_TF_THREADS),TF_NUM_INTRAOP_THREADS=$(TEST_TF_THREADS) TF_NUM_INTEROP_THREADS=$(TEST_TF_THREADS))
test: install lint
	TF_CPP_MIN_LOG_LEVEL=2 $(TF_THREADS_ENV) $(PY) -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

demo: install
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) -m launchers.demo

# Digits, then the paper's MNIST protocol (../shared/data/mnist; skipped without it): ~10 min.
bench: install
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m benchmarks.round_time

clean-venv:
	rm -rf $(VENV)
