# bisect-precision-docker: set-up, checks, demo and benchmarks.
# `make setup` is idempotent: a second run does nothing slow.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_BASE := bisect-precision-test-base:bookworm
PYTEST_ARGS ?=

.PHONY: setup system-packages venv docker-engine test-base test lint pytest demo bench clean

setup: system-packages venv docker-engine test-base

# git and venv support are all the host needs besides Docker; install them only when missing.
system-packages:
	@missing=""; \
	command -v git >/dev/null 2>&1 || missing="$$missing git"; \
	$(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

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
