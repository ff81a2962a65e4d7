# Everything runs from a virtualenv that `make` creates on first use (needs only python3 with venv and pip).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run simulate test test-fast lint package clean

# Two install steps: `make run` needs only the runtime (requirements-run.txt: the functions' dependencies, Chalice's
# local server, an embedded Valkey) and the operator CLI, `vq`; every other target adds the development toolchain.
# The CLI is installed from pyproject.toml in editable mode, so .venv/bin/vq runs this checkout's infra/vq/.
$(VENV)/.run-installed: requirements.txt requirements-run.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-run.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

# checkov pins its own boto3, older than the functions': it gets a virtualenv of its own (tests/test_stack_hygiene.py).
$(VENV)/.installed: $(VENV)/.run-installed requirements-dev.txt requirements-checkov.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

## Start the whole waiting room locally on embedded defaults (Ctrl-C stops all of it). Options: PORT (the API's;
## the demo shop takes the next), STOCK (units per drop or event in the demo shop), VERBOSE=1 (request logs on the
## terminal rather than in build/local/api.log). EMF metric lines would only flood the log, so they are off unless
## POWERTOOLS_METRICS_DISABLED says otherwise.
PORT ?= $(or $(VQ_LOCAL_PORT),8000)
STOCK ?= 100
run: $(VENV)/.run-installed
	@POWERTOOLS_METRICS_DISABLED=$${POWERTOOLS_METRICS_DISABLED:-true} $(BIN)/python infra/local/stack.py \
		--port $(PORT) --stock $(STOCK) $(if $(VERBOSE),--verbose)

## A flash sale on the local stack: 5,000 users in a burst; report and plot in build/simulation/ (SIMULATE_ARGS="--help").
simulate: $(VENV)/.installed
	$(BIN)/python infra/sim/simulate.py $(SIMULATE_ARGS)

## Run the test suite against a real Redis (REDIS_URL, else an embedded Valkey), then the reliability steps:
## Redis faults against servers the tests kill and restart, the store's tests on a 3-node Valkey cluster, and over
## TLS; then the JavaScript client's tests; then every benchmark with tiny sizes, so that one that no longer runs
## fails the build. Every step runs whatever an earlier one did; a line per step and one of what was skipped, and
## why, close the run, whose exit status is 1 if any step failed (tests/support/steps.py).
TEST_STEPS := test-main test-faults test-cluster test-tls test-js bench-quick
test: $(VENV)/.installed
	@$(BIN)/python tests/support/steps.py --make "$(MAKE)" $(TEST_STEPS)

# Tests that start Redis servers of their own (markers in pyproject.toml), and the suites the cluster run repeats.
RELIABILITY := -m "faults or cluster"
CLUSTER_SUITE := tests/test_queue_engine.py tests/test_pump.py tests/test_safety_net.py tests/test_purchase.py tests/test_operations.py \
	tests/test_events.py tests/test_api.py tests/test_queue_model.py tests/test_failover_fences.py tests/test_sharding.py \
	tests/test_sharded_pump.py
# The store's suites again over rediss:// to a TLS-only redis-server cluster (about 35 s). Left out: 50 threads
# opening 50 TLS connections at once, which on a 2-core machine outlast the 0.2 s connect timeout (a Lambda
# container opens one).
TLS_SUITE := tests/test_queue_engine.py tests/test_pump.py -k "not concurrent_arrivals"
# A PYTEST_ARGS that narrows the run (-k tokens) may leave a step nothing to run (pytest's exit status 5).
ifneq ($(PYTEST_ARGS),)
NOTHING_SELECTED_OK := || [ $$? -eq 5 ]
endif

## The loop while changing code: the suite without the slow, fault, cluster and deployment tests (docs/testing.md).
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -m "not slow and not faults and not cluster and not deploy" $(PYTEST_ARGS) $(NOTHING_SELECTED_OK)

## Static checks: ruff (lint and format) on all the Python, mypy on app.py, chalicelib/ (a typed package) and infra/vq/.
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

.PHONY: test-main test-reliability test-faults test-cluster test-tls
test-main: $(VENV)/.installed
	$(BIN)/python -m pytest -m "not faults and not cluster" $(PYTEST_ARGS) $(NOTHING_SELECTED_OK)

# The reliability steps alone, each run whatever the others did.
test-reliability: $(VENV)/.installed
	@$(BIN)/python tests/support/steps.py --make "$(MAKE)" test-faults test-cluster test-tls

test-faults: $(VENV)/.installed
	$(BIN)/python -m pytest $(RELIABILITY) $(PYTEST_ARGS) $(NOTHING_SELECTED_OK)

test-cluster: $(VENV)/.installed
	$(BIN)/python -m pytest --redis-cluster $(CLUSTER_SUITE) $(PYTEST_ARGS) $(NOTHING_SELECTED_OK)

test-tls: $(VENV)/.installed
	$(BIN)/python -m pytest --redis-tls-cluster $(TLS_SUITE) $(PYTEST_ARGS) $(NOTHING_SELECTED_OK)

## The JavaScript client (clients/js/): npm ci from its lockfile, tsc, then node --test, its integration tests
## against the local stack started here (tests/support/js_client.py). Without Node it skips, saying so; in CI it fails.
.PHONY: test-js
test-js: $(VENV)/.installed
	$(BIN)/python tests/support/js_client.py

## Measure the performance targets on an embedded Valkey: one table, also build/bench.json and the figures of
## docs/benchmarks.md (a few minutes; needs redis-benchmark).
.PHONY: bench bench-quick
bench: $(VENV)/.installed
	$(BIN)/python tests/perf/bench.py

## Every benchmark with tiny sizes and one round (about a minute): shows they all still run; the figures mean nothing.
bench-quick: $(VENV)/.installed
	$(BIN)/python tests/perf/bench.py --quick

## The browser suites (Chromium); refreshes the README's screenshots in tests/screenshots/ (all views: build/browser/).
.PHONY: screenshots
screenshots: $(VENV)/.installed
	VQ_README_SHOTS=1 $(BIN)/python -m pytest tests/test_browser.py tests/test_console.py $(PYTEST_ARGS)

## Build the deployment offline into build/: sam.json (CloudFormation/SAM) and deployment.zip (README: Deploy), for
## the functions' architecture (.chalice/config.json: arm64; ARCHITECTURE=x86_64 builds one this machine can run).
STAGE ?= prod
package: $(VENV)/.installed
	$(BIN)/python infra/package.py --stage $(STAGE) $(if $(ARCHITECTURE),--architecture $(ARCHITECTURE)) build

clean:
	rm -rf $(VENV) build .pytest_cache *.egg-info
