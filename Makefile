# One-command set-up: `make serve` serves the bundled servables, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup models serve test lint unit e2e faults bench proto clean

$(STAMP): requirements.txt requirements-dev.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

models: setup
	$(PY) servables/export_models.py

serve: models
	$(PY) serving_server.py

lint: setup
	$(VENV)/bin/lint-imports --no-logo

test: models lint
	$(PY) -m pytest tests

unit: setup
	$(PY) -m pytest tests/unit

e2e: models
	$(PY) -m pytest tests/e2e

faults: models
	$(PY) -m pytest tests/faults

bench: models
	$(PY) bench/classic.py

proto: setup
	$(PY) mindspore_serving/proto/generate.py

clean:
	rm -rf serving_logs unix_socket_files .pytest_cache
