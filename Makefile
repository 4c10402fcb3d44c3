# One-command set-up: `make serve` serves the bundled servables, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup clients models serve test lint docs unit e2e faults bench proto wheel package-test clean oracle-fixtures

# uv installs the pinned requirements (pip resolves the same pins, several times slower): it is bootstrapped with pip.
# Bytecode is compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, every process of the suite
# would otherwise compile MindSpore's modules again (an import took 4.1 s instead of 2.0)
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv

$(STAMP): requirements.txt requirements-dev.txt requirements-docs.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV_VERSION)
	$(UV) pip install -q --python $(PY) --compile-bytecode -r requirements-dev.txt
	$(UV) pip install -q --python $(PY) --no-deps -e .
	$(PY) -m compileall -q mindspore_serving
	touch $(STAMP)

setup: $(STAMP)

# The Triton client of the KServe v2 e2e tests, in a virtualenv of its own (see requirements-clients.txt)
CLIENTS_VENV := .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed

$(CLIENTS_STAMP): requirements-clients.txt $(STAMP)
	test -x $(CLIENTS_VENV)/bin/python || $(UV) venv -q --python $(PYTHON) $(CLIENTS_VENV)
	$(UV) pip install -q --python $(CLIENTS_VENV)/bin/python --compile-bytecode -r requirements-clients.txt
	touch $(CLIENTS_STAMP)

clients: $(CLIENTS_STAMP)

models: setup
	$(PY) servables/export_models.py

serve: models
	$(PY) serving_server.py

# The docs site (mkdocs.yml): the Reference pages are written from the code first (docs/gen_reference.py); --strict
# makes a broken link or anchor an error
docs: setup
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# ruff's rules and format, mypy (strict on llm/ spec/ common/ ipc/, a baseline elsewhere: pyproject.toml) and
# the layer contracts (setup.cfg); mypy's cache (.mypy_cache) makes a second run take seconds
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

# The set-up steps run side by side (exporting the models is the long one), then the suite, the wheel's install
# test among it, in two processes: the unit tests (pure Python on one core) beside the served ones, whose servers'
# start-ups wait on each other and leave a core idle about a third of the time. The unit tests' output follows the
# served tests'. Split by pytest-xdist instead, two workers each starting servers took longer on two cores (14.4 min
# against about 13 in one process).
UNIT_LOG := .unit-tests.log
test: setup
	$(MAKE) --no-print-directory -j 4 --output-sync=target models lint docs clients wheel
	@echo "tests/unit runs beside the other tests; its output ($(UNIT_LOG)) follows theirs"
	@$(PY) -m pytest -p no:cacheprovider tests/unit > $(UNIT_LOG) 2>&1 & unit=$$!; \
	MS_SERVING_WHEEL="$$(ls dist/*.whl)" $(PY) -m pytest tests --ignore=tests/unit; served=$$?; \
	wait $$unit; unit=$$?; cat $(UNIT_LOG); \
	echo "tests/unit exited with $$unit, the other tests with $$served"; [ $$served = 0 ] && [ $$unit = 0 ]

unit: setup
	$(PY) -m pytest tests/unit

e2e: models clients
	$(PY) -m pytest tests/e2e

faults: models
	$(PY) -m pytest tests/faults

bench: models
	$(PY) bench/classic.py

proto: setup
	$(PY) mindspore_serving/proto/generate.py

# The wheel, into dist/: build/ is removed first, so that no module deleted since the last build lingers in it, and
# after, so that no second copy of the package lies in the tree
wheel: setup
	rm -rf build dist
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	rm -rf build

# That wheel alone in a fresh venv: its declared dependencies import every module, and the command runs
package-test: wheel
	MS_SERVING_WHEEL="$$(ls dist/*.whl)" $(PY) -m pytest -q tests/packaging

# Rebuilds tests/fixtures/hf with transformers as the oracle, in a virtualenv of its own (see requirements-oracle.txt)
oracle-fixtures:
	test -x .venv-oracle/bin/python || $(PYTHON) -m venv .venv-oracle
	.venv-oracle/bin/python -m pip install -q -r requirements-oracle.txt
	.venv-oracle/bin/python tests/fixtures/hf/make_fixtures.py

clean:
	rm -rf serving_logs unix_socket_files .pytest_cache build dist $(UNIT_LOG)
