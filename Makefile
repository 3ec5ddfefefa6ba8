# `make test` and `make demo` work on a fresh machine: they create .venv and install first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test unit lint demo bench browser reliability clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The unit tests on both cores, then the integration tests on both cores, a module per core
# at a time: each core's tests have their own database and RabbitMQ virtual host, and
# the outages are of private servers (tests/services.py).
test: $(STAMP)
	$(BIN)/python -m pytest tests/unit -n 2 $(PYTEST_ARGS)
	$(BIN)/python -m pytest tests/integration -n 2 --dist loadfile $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -n 2 $(PYTEST_ARGS)

# The service as separate processes under fire, then every promise checked (docs/operations.md);
# ARGS='--brands 5000 --seed 7' for a bigger or a repeated run.
reliability: $(STAMP)
	$(BIN)/python -m tests.reliability $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The web view's browser test drives Debian's headless chromium (idempotent; needs root).
browser:
	command -v chromedriver >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

demo: $(STAMP)
	$(BIN)/provisioner demo

# Runs every benchmark and rewrites the figures in docs/benchmarks.md (BENCH_ARGS=--quick: small
# sizes, a smoke check; --no-write: print only). ARGS is accepted too.
bench: $(STAMP)
	$(BIN)/python bench/report.py $(BENCH_ARGS) $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
