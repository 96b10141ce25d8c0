# bisect-precision-docker: set-up, checks, demo and benchmarks.
# `make setup` is idempotent: a second run does nothing slow.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_BASE := bisect-precision-test-base:bookworm
PYTEST_ARGS ?=

.PHONY: setup venv docker-engine test-base test lint pytest demo bench clean

setup: venv docker-engine test-base

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

docker-engine:
	sh .ci/start-docker.sh

test-base: docker-engine
	sh dockerfiles/test-base/make-base.sh $(TEST_BASE)

test: lint pytest

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# pytest exits 5 when it collects nothing (a -k or -m that matches no test): report it, not fail.
pytest: venv
	$(BIN)/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: nothing was checked" >&2; rc=0; fi; \
	exit $$rc

demo: setup
	$(BIN)/python -m runner.sample.demo --base-image $(TEST_BASE)

bench: setup
	$(BIN)/python tests/bench/bench_overhead.py --base-image $(TEST_BASE)
	$(BIN)/python tests/bench/bench_export.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis demo bisect-precision
