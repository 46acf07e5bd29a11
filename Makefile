# Quickstart targets. `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch's CPU build where this machine's pip finds it (a PyPI torch on Linux pulls in CUDA)
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e ".[dev,cluster,models]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mlirrl-jax demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadscope --durations=15

# no kernel timed, no training: the library's logic, the command line, the pipeline's text
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadscope -m "not measures and not trains and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) bench/bench_foundation.py

clean:
	rm -rf $(VENV) .pytest_cache
