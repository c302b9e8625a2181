# krypton - see README.md. Every target sets up what it needs.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TESTBIN_DIR = $(shell bash hack/testbin.sh 2>/dev/null | tail -n1)
PIDFILE ?= /tmp/krypton-operator.pid
RUN_ARGS ?=
PYTEST_ARGS ?=
# make test's pytest workers, each with control planes of its own (most of a test is
# waiting); a module's tests stay on one worker, in their order
PYTEST_WORKERS ?= 2
XDIST = -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: install testbin test test-helm3 unit integration e2e e2e-kind demo bench lint run run-pid stop clean image image-lock runtime docs figures

install: $(STAMP) testbin $(BIN)/krypton-helmworker

# the helm worker (SPEC P5), beside the krypton command
$(BIN)/krypton-helmworker: $(STAMP) hack/helmworker.sh hack/testbin.sh $(wildcard helmworker/*.go) helmworker/go.mod helmworker/go.sum
	bash hack/helmworker.sh $(BIN)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

testbin:
	bash hack/testbin.sh >/dev/null

# pytest exits 5 when a selection ran no test; that is not a failure of the suite.
# The whole suite runs on Helm 4; the tests marked helm3lane run again on Helm 3 (SPEC H1).
# Then hack/e2e-kind.sh on two kind clusters (SPEC T9).
test: install lint docs image runtime
	KRYPTON_TESTBIN_DIR=$(TESTBIN_DIR) $(BIN)/pytest $(XDIST) $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; \
	  [ $$rc -eq 0 ] || exit $$rc; $(MAKE) --no-print-directory test-helm3 && $(KIND_LANE)

test-helm3: install
	KRYPTON_TEST_HELM=3 KRYPTON_HELM_ENGINE=binary KRYPTON_TESTBIN_DIR=$(TESTBIN_DIR) $(BIN)/pytest -m helm3lane $(XDIST) $(PYTEST_ARGS); \
	  rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

unit: $(STAMP)
	$(BIN)/pytest -m unit $(PYTEST_ARGS)

integration: install
	KRYPTON_TESTBIN_DIR=$(TESTBIN_DIR) $(BIN)/pytest -m integration $(PYTEST_ARGS)

e2e: install
	KRYPTON_TESTBIN_DIR=$(TESTBIN_DIR) $(BIN)/python -m krypton.testing.e2e

# hack/e2e-kind.sh as users run it, here with podman as kind's provider and a node image
# built here (krypton/testing/kind.py); with Docker and kind's own images, run the script.
# (make test runs the lane's command itself: its image and runtime are made by then)
KIND_LANE = KRYPTON_TESTBIN_DIR=$$(bash hack/testbin.sh kind 2>/dev/null | tail -n1) \
	  $(BIN)/python -m krypton.testing.kind
e2e-kind: install image runtime
	$(KIND_LANE)

demo: install
	KRYPTON_TESTBIN_DIR=$(TESTBIN_DIR) $(BIN)/python -m krypton.testing.demo

bench: install
	KRYPTON_TESTBIN_DIR=$(TESTBIN_DIR) $(BIN)/python -m krypton.testing.bench

# The operator image as an OCI archive in dist/ (see hack/image.sh); image-lock re-pins its
# Debian packages and Python wheels.
image: install
	PYTHON=$(BIN)/python HELM=$(TESTBIN_DIR)/helm HELMWORKER=$(abspath $(BIN)/krypton-helmworker) bash hack/image.sh

runtime:
	bash hack/runtime.sh

image-lock: $(STAMP)
	PYTHON=$(BIN)/python bash hack/image.sh lock

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the figures the README shows, drawn from bench/results.json (`make docs` fails on a stale one)
figures: $(STAMP)
	$(BIN)/python hack/docs_hooks.py

lint: $(STAMP)
	$(BIN)/ruff check krypton tests
	$(BIN)/mypy
	$(BIN)/lint-imports
	bash hack/helmworker.sh check

run: install
	PATH=$(TESTBIN_DIR):$$PATH $(BIN)/krypton run $(RUN_ARGS)

run-pid: install
	@if [ -f $(PIDFILE) ] && kill -0 $$(cat $(PIDFILE)) 2>/dev/null; then \
	  echo "krypton already running with PID $$(cat $(PIDFILE))"; exit 1; fi
	PATH=$(TESTBIN_DIR):$$PATH setsid nohup $(BIN)/krypton run $(RUN_ARGS) >/tmp/krypton-operator.log 2>&1 & echo $$! > $(PIDFILE)
	@echo "krypton started with PID $$(cat $(PIDFILE)); log in /tmp/krypton-operator.log"

stop:
	@bash hack/stop.sh $(PIDFILE)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
