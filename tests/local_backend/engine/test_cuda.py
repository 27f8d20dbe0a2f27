"""The same engine on a CUDA device (run where one is present; skipped cleanly elsewhere)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from local_backend.engine.loop import Engine, EngineConfig
from local_backend.engine.params import SamplingParams
from local_backend.model.config import LlamaConfig
from local_backend.model.loader import load_model
from local_backend.tokenizer import Tokenizer
from tests.local_backend import reference
from tests.local_backend.engine.test_greedy_matches_reference import prompt, run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


async def check_batch(engine: Engine, state: dict[str, torch.Tensor], config: LlamaConfig,
                      ) -> None:
    prompts = [prompt(i, n) for i, n in enumerate((23, 5, 40, 17))]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    runs = (run(engine, f"r{i}", p, params) for i, p in enumerate(prompts))
    results = await asyncio.gather(*runs)
    for ids, (tokens, _) in zip(prompts, results, strict=True):
        assert tokens == reference.greedy(state, config, ids, 8)


async def test_fp32_on_cuda_matches_the_reference(
    tiny_dir: Path, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig
) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    model = load_model(tiny_dir, device="cuda", dtype=torch.float32, progress=None)
    engine = Engine(model, Tokenizer.from_dir(tiny_dir), EngineConfig(num_blocks=64, block_size=4))
    engine.start()
    try:
        await check_batch(engine, tiny_state, tiny_config)
    finally:
        engine.stop()
    assert engine.blocks.num_free == engine.blocks.num_blocks


async def test_bf16_on_cuda_generates_and_frees_every_block(tiny_dir: Path) -> None:
    model = load_model(tiny_dir, device="cuda", dtype=torch.bfloat16, progress=None)
    engine = Engine(model, Tokenizer.from_dir(tiny_dir), EngineConfig(num_blocks=64, block_size=4))
    engine.start()
    try:
        tokens, _ = await run(engine, "bf16", prompt(0, 30), SamplingParams(
            max_tokens=16, temperature=0.7, seed=1, ignore_eos=True))
    finally:
        engine.stop()
    assert len(tokens) == 16
    assert engine.blocks.num_free == engine.blocks.num_blocks
