"""Fixtures: a tiny checkpoint, its weights for the reference, engines that must not leak."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from local_backend.demo import write_checkpoint, write_tokenizer
from local_backend.engine.loop import Engine, EngineConfig
from local_backend.model.config import LlamaConfig
from local_backend.model.loader import load_model
from local_backend.tokenizer import Tokenizer

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _flush_denormals() -> Any:
    # The engine runs with flush-to-zero, as the server does. The mode is
    # process-wide, so it is switched off again: other suites in the same
    # pytest process (hypothesis float strategies) need IEEE subnormals.
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)

TINY: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 260,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "eos_token_id": [257, 259],
}


def make_checkpoint(directory: Path, config: dict[str, Any], *, shards: int = 1) -> Path:
    # std 0.3 (not 0.02) so the tiny model's greedy choices are varied and well separated.
    write_tokenizer(directory)
    write_checkpoint(directory, config, seed=1, shards=shards, std=0.3)
    return directory


def load_state(directory: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        state.update({k: v.double() for k, v in load_file(str(path)).items()})
    return state


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("tiny"), TINY)


@pytest.fixture(scope="session")
def tiny_state(tiny_dir: Path) -> dict[str, torch.Tensor]:
    return load_state(tiny_dir)


@pytest.fixture(scope="session")
def tiny_config() -> LlamaConfig:
    return LlamaConfig.from_dict(TINY)


async def wait_all_blocks_free(engine: Engine, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while engine.blocks.num_free != engine.blocks.num_blocks:
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.005)


EngineFactory = Callable[..., Engine]


@pytest.fixture
async def make_engine(tiny_dir: Path) -> AsyncIterator[EngineFactory]:
    """Started engines over the tiny model in float64 (on `device`, CPU by default); every
    block must be free at the end."""
    engines: list[Engine] = []
    models = {"cpu": load_model(tiny_dir, dtype=torch.float64, progress=None)}
    tokenizer = Tokenizer.from_dir(tiny_dir)

    def factory(start: bool = True, device: str = "cpu", **overrides: Any) -> Engine:
        if device not in models:
            models[device] = load_model(tiny_dir, device=device, dtype=torch.float64,
                                        progress=None)
        config = EngineConfig(**{"num_blocks": 64, "block_size": 4, **overrides})
        engine = Engine(models[device], tokenizer, config, eos_token_ids=())
        if start:
            engine.start()
        engines.append(engine)
        return engine

    yield factory
    try:
        for engine in engines:
            await wait_all_blocks_free(engine)
            assert engine.blocks.num_free == engine.blocks.num_blocks, "KV blocks leaked"
            assert not engine.scheduler.running and not engine.scheduler.waiting
    finally:
        for engine in engines:
            engine.stop()
