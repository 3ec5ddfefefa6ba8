# `make test` and `make demo` work on a fresh machine: they create .venv and install first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test unit lint demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

demo: $(STAMP)
	$(BIN)/provisioner demo

bench: $(STAMP)
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/readmodels.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
