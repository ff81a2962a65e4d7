# Everything runs from a virtualenv that `make` creates on first use (needs only python3 with venv and pip).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run simulate test package clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

## Start the whole waiting room locally on embedded defaults (Ctrl-C stops all of it). EMF metric lines
## would only flood the terminal here, so they are off unless POWERTOOLS_METRICS_DISABLED says otherwise.
run: $(VENV)/.installed
	POWERTOOLS_METRICS_DISABLED=$${POWERTOOLS_METRICS_DISABLED:-true} $(BIN)/python infra/local_stack.py

## A flash sale on the local stack: 5,000 users in a burst; report and plot in build/simulation/ (SIMULATE_ARGS="--help").
simulate: $(VENV)/.installed
	$(BIN)/python infra/simulate.py $(SIMULATE_ARGS)

## Run the test suite against a real Redis (REDIS_URL, else an embedded Valkey).
test: $(VENV)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## Measure the performance targets on an embedded Valkey: one table, also build/bench.json (a few minutes; needs redis-benchmark).
.PHONY: bench
bench: $(VENV)/.installed
	$(BIN)/python tests/perf/bench.py

## Build the deployment offline into build/: sam.json (CloudFormation/SAM) and deployment.zip (README: Deploy).
STAGE ?= prod
package: $(VENV)/.installed
	$(BIN)/python infra/package.py --stage $(STAGE) build

clean:
	rm -rf $(VENV) build .pytest_cache
