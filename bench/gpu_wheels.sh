#!/usr/bin/env bash
# Fill bench/.wheels (git-ignored) with the wheels bench/gpu.sh installs on a machine
# without network: the project's pins (requirements.lock) of the packages a CUDA image
# with torch, transformers, pytest and hypothesis usually lacks. Pure-Python wheels,
# so the machine's Python version does not matter.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
pins=()
for name in pytest-asyncio gguf; do
    pins+=("$(grep -i "^$name==" requirements.lock)")
done
"$py" -m pip download --no-deps --only-binary=:all: -d bench/.wheels "${pins[@]}"
