# The two commands: `make demo` and `make test`. Both bootstrap .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.logsdk-installed

.PHONY: demo test lint typecheck unit bench chaos clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest

unit: $(STAMP)
	$(VENV)/bin/pytest tests/unit

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

SEED ?= 1
DURATION ?= 300
chaos: $(STAMP)
	$(PY) -m logsdk.testing.chaos --duration $(DURATION) --seed $(SEED) --results benchmarks/results.json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
