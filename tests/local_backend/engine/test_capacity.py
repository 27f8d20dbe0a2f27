"""Capacity from a warm-up: the largest step runs before the KV cache is sized."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from local_backend.engine.capacity import (
    CPU_DEFAULTS,
    GPU_DEFAULTS,
    DeviceDefaults,
    blocks_in,
    defaults_for,
    kv_blocks,
    kv_bytes_per_block,
)
from local_backend.engine.runner import ModelRunner
from local_backend.model.loader import load_model


def test_a_gpu_runs_256_sequences_and_8192_tokens_a_step() -> None:
    assert defaults_for(torch.device("cuda")) == GPU_DEFAULTS == DeviceDefaults(256, 8192)
    assert defaults_for(torch.device("cpu")) == CPU_DEFAULTS


def test_blocks_are_whole_and_never_negative() -> None:
    assert blocks_in(10_000, 3_000) == 3
    assert blocks_in(2_999, 3_000) == 0
    assert blocks_in(-5, 3_000) == 0


def test_block_bytes_are_the_runner_s(tiny_dir: Path) -> None:
    model = load_model(tiny_dir, dtype=torch.float32, progress=None)
    assert kv_bytes_per_block(model, 16) == ModelRunner.kv_bytes_per_block(model, 16)
    # 2 (k, v) × 2 layers × 16 tokens × 2 kv heads × 16 dims × 4 bytes
    assert kv_bytes_per_block(model, 16) == 8192


def test_on_cpu_the_warm_up_runs_and_the_cache_gets_its_budget(tiny_dir: Path) -> None:
    model = load_model(tiny_dir, dtype=torch.float32, progress=None)
    blocks = kv_blocks(model, 16, DeviceDefaults(max_num_seqs=4, max_num_batched_tokens=64),
                       cpu_budget_bytes=81920)
    assert blocks == 10


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_cache_takes_what_the_largest_step_leaves(tiny_dir: Path) -> None:
    model = load_model(tiny_dir, device="cuda", dtype=torch.bfloat16, progress=None)
    small = kv_blocks(model, 16, DeviceDefaults(4, 64), memory_fraction=0.5)
    _, total = torch.cuda.mem_get_info()
    per_block = kv_bytes_per_block(model, 16)
    assert 0 < small <= total * 0.5 // per_block
    # A larger step leaves less (or as much) room for the cache.
    assert kv_blocks(model, 16, DeviceDefaults(256, 8192), memory_fraction=0.5) <= small
