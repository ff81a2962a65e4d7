# Everything runs from a virtualenv that `make` creates on first use (needs only python3 with venv and pip).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test package clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

## Start the whole waiting room locally on embedded defaults (Ctrl-C stops all of it).
run: $(VENV)/.installed
	$(BIN)/python infra/local_stack.py

## Run the test suite against a real Redis (REDIS_URL, else an embedded Valkey).
test: $(VENV)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## Build the deployment offline into build/: sam.json (CloudFormation/SAM) and deployment.zip (README: Deploy).
STAGE ?= prod
package: $(VENV)/.installed
	$(BIN)/python infra/package.py --stage $(STAGE) build

clean:
	rm -rf $(VENV) build .pytest_cache
