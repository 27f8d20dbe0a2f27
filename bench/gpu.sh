#!/usr/bin/env bash
# The engine's CUDA checks and figures in one run of under 9 minutes, on a machine with a
# CUDA torch and no network:
#     bash bench/gpu.sh [OUTDIR]          (OUTDIR: $OUT, else /tmp/routegate-gpu)
# Packages the project needs there and such a machine may lack (pytest-asyncio, gguf)
# install from bench/.wheels, which bench/gpu_wheels.sh fills where PyPI is reachable.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/routegate-gpu}}
mkdir -p "$out"
py=${PYTHON:-python3}
missing=$("$py" - <<'PY'
import importlib.util
need = ["torch", "numpy", "tokenizers", "safetensors", "gguf", "transformers", "pytest",
        "pytest_asyncio", "hypothesis"]
print(" ".join(name for name in need if importlib.util.find_spec(name) is None))
PY
)
if [ -n "$missing" ]; then
    echo "missing here: $missing"
    if ls bench/.wheels/*.whl >/dev/null 2>&1; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target /tmp/routegate-site bench/.wheels/*.whl || exit 1
        export PYTHONPATH=/tmp/routegate-site
    else
        echo "and no bench/.wheels: run bench/gpu_wheels.sh where PyPI is reachable" >&2
    fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
"$py" -c "import torch, transformers, pytest; print('torch', torch.__version__, 'cuda',
    torch.version.cuda, 'transformers', transformers.__version__, 'pytest', pytest.__version__)" \
    | tee -a "$out/device.txt"

# 1. The tests marked gpu: greedy equality of both attention paths with the reference
#    (mixed batches, chunked prefill, preemption, prefix hits), the batched sampler,
#    the engine in fp32 and bf16. The repository's top conftest (the gateway's) is
#    left out: it needs the gateway's packages.
timeout 150 "$py" -m pytest -v -m gpu --confcutdir=tests/local_backend -p no:cacheprovider \
    --durations=5 tests/local_backend/engine 2>&1 | tee "$out/tests.txt"

# 2. The figures: both models, 1/16/64/256 streams, the engine eager and with decode
#    steps from CUDA graphs, beside transformers' generate.
timeout 300 "$py" bench/gpu.py --variants sdpa sdpa+graphs --json "$out/gpu.json" 2>&1 \
    | tee "$out/gpu.txt"

# 3. If time is left: the compiled FlexAttention path on one model, without the baseline
#    (its first steps include the compilation).
timeout 80 "$py" bench/gpu.py --models qwen2.5-0.5b --streams 1 64 --no-baseline \
    --variants flex-compiled --json "$out/gpu-flex.json" 2>&1 | tee "$out/gpu-flex.txt"
