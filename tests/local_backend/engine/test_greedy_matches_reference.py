"""Greedy tokens from the engine equal a no-cache reference forward, whatever the batch does,
with either attention path (gather + SDPA, and FlexAttention over the cache in place), on
the CPU and, where there is one, on a CUDA device."""

from __future__ import annotations

import asyncio
import functools
import random

import pytest
import torch

from local_backend.engine.loop import Engine
from local_backend.engine.params import SamplingParams
from local_backend.model.config import LlamaConfig
from tests.local_backend import reference
from tests.local_backend.conftest import EngineFactory

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
_CUDA = [pytest.mark.gpu,
         pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
PATHS = [  # (device, attention, CUDA graphs for decode steps)
    pytest.param(("cpu", "sdpa", False), id="cpu-sdpa"),
    pytest.param(("cpu", "flex", False), id="cpu-flex"),
    pytest.param(("cpu", "sdpa", True), id="cpu-graphs-ignored"),
    pytest.param(("cuda", "sdpa", False), id="cuda-sdpa", marks=_CUDA),
    pytest.param(("cuda", "flex", False), id="cuda-flex", marks=_CUDA),
    pytest.param(("cuda", "sdpa", True), id="cuda-sdpa-graphs", marks=_CUDA),
]


@pytest.fixture(params=PATHS)
def make_engine(request: pytest.FixtureRequest, make_engine: EngineFactory) -> EngineFactory:
    """The shared factory, on one device with one attention path."""
    device, attention, graphs = request.param
    return functools.partial(make_engine, device=device, attention=attention,
                             cuda_graphs=graphs)


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 256) for _ in range(length)]


async def run(engine: Engine, request_id: str, ids: list[int], params: SamplingParams = GREEDY,
              ) -> tuple[list[int], int]:
    tokens: list[int] = []
    cached = 0
    async for out in engine.generate(request_id, ids, params):
        tokens += out.token_ids
        cached = out.cached_tokens
    return tokens, cached


async def test_one_request_alone_matches_reference(
    make_engine: EngineFactory, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig
) -> None:
    ids = prompt(0, 23)
    tokens, _ = await run(make_engine(), "alone", ids)
    assert tokens == reference.greedy(tiny_state, tiny_config, ids, 10)


async def test_request_inside_a_mixed_batch_matches_reference(
    make_engine: EngineFactory, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig
) -> None:
    engine = make_engine(max_num_batched_tokens=32)  # prompts are chunked across steps too
    prompts = [prompt(i, n) for i, n in enumerate((23, 5, 40, 1, 17, 64, 9))]
    lengths = [10, 3, 7, 12, 1, 5, 10]
    results = await asyncio.gather(*(
        run(engine, f"r{i}", ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        for i, (ids, n) in enumerate(zip(prompts, lengths, strict=True))
    ))
    for ids, n, (tokens, _) in zip(prompts, lengths, results, strict=True):
        assert tokens == reference.greedy(tiny_state, tiny_config, ids, n)


async def test_preempted_requests_recompute_to_the_same_tokens(
    make_engine: EngineFactory, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig
) -> None:
    # 24 blocks × 4 tokens = 96 slots; four sequences growing to 34 tokens cannot all fit.
    engine = make_engine(num_blocks=24, block_size=4, prefix_caching=False)
    prompts = [prompt(10 + i, 14) for i in range(4)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    runs = (run(engine, f"p{i}", p, params) for i, p in enumerate(prompts))
    results = await asyncio.gather(*runs)
    assert engine.stats().preemptions > 0
    for ids, (tokens, _) in zip(prompts, results, strict=True):
        assert tokens == reference.greedy(tiny_state, tiny_config, ids, 20)


async def test_prefix_cache_hit_reuses_blocks_and_matches_reference(
    make_engine: EngineFactory, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig
) -> None:
    engine = make_engine()
    shared = prompt(42, 20)
    first, first_cached = await run(engine, "first", [*shared, 1, 2, 3])
    second_ids = [*shared, 7, 8, 9, 10, 11]
    second, second_cached = await run(engine, "second", second_ids)
    assert first_cached == 0
    assert second_cached == 20  # five full 4-token blocks of the shared prefix
    assert first == reference.greedy(tiny_state, tiny_config, [*shared, 1, 2, 3], 10)
    assert second == reference.greedy(tiny_state, tiny_config, second_ids, 10)


async def test_identical_prompt_is_served_from_cache_except_its_last_token(
    make_engine: EngineFactory, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig
) -> None:
    engine = make_engine()
    ids = prompt(7, 16)  # exactly four blocks: the last block must still be computed
    await run(engine, "a", ids)
    tokens, cached = await run(engine, "b", ids)
    assert cached == 12
    assert tokens == reference.greedy(tiny_state, tiny_config, ids, 10)


async def test_long_prompt_is_prefilled_in_chunks_and_matches_reference(
    make_engine: EngineFactory, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig
) -> None:
    engine = make_engine(max_num_batched_tokens=7)
    ids = prompt(3, 50)
    tokens, _ = await run(engine, "long", ids)
    assert tokens == reference.greedy(tiny_state, tiny_config, ids, 10)


async def test_new_prompts_do_not_stall_running_streams(make_engine: EngineFactory) -> None:
    # 8 tokens per step: the newcomer's 60-token prompt takes 9 steps to prefill, and the
    # running request must get a token in each of those steps.
    engine = make_engine(max_num_batched_tokens=8, num_blocks=128)
    running = engine.generate("running", prompt(1, 4), SamplingParams(
        max_tokens=60, temperature=0.0, ignore_eos=True))
    times = [(await anext(running)).time for _ in range(2)]

    async def newcomer() -> list[float]:
        return [o.time async for o in engine.generate("newcomer", prompt(2, 60), GREEDY)]

    sent = engine.clock()
    newcomer_times = asyncio.ensure_future(newcomer())
    times += [out.time async for out in running]
    first_token = (await newcomer_times)[0]
    assert len([t for t in times if sent < t < first_token]) >= 8
