"""The real engine under the priority policy: a better band displaces a running worse one,
and the displaced sequence, recomputed later, writes exactly the greedy tokens it would
have written alone (on CPU against the float64 reference; on CUDA where one is present)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from local_backend.engine.loop import Engine, EngineConfig, RequestOutput
from local_backend.engine.params import SamplingParams
from local_backend.model.config import LlamaConfig
from local_backend.model.loader import load_model
from local_backend.tokenizer import Tokenizer
from tests.local_backend import reference
from tests.local_backend.engine.test_greedy_matches_reference import prompt

HIGH, LOW, BATCH = 0, 2, 3  # BATCH: the gateway's batch band, background by default
LONG = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
]


@pytest.fixture(params=DEVICES)
def engine(request: pytest.FixtureRequest, tiny_dir: Path) -> Iterator[Engine]:
    device = request.param
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    dtype = torch.float64 if device == "cpu" else torch.float32
    model = load_model(tiny_dir, device=device, dtype=dtype, progress=None)
    # Two sequences per batch: a third of a better band must displace one.
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=2)
    started = Engine(model, Tokenizer.from_dir(tiny_dir), config, eos_token_ids=())
    started.start()
    yield started
    started.stop()
    assert started.blocks.num_free == started.blocks.num_blocks, "KV blocks leaked"


async def collect(outputs: asyncio.Queue[RequestOutput]) -> tuple[list[int], RequestOutput]:
    tokens: list[int] = []
    while True:
        out = await outputs.get()
        tokens += out.token_ids
        if out.finished:
            return tokens, out


async def until_running(engine: Engine, count: int) -> None:
    for _ in range(2000):  # the engine runs in its own thread: polled
        if len(engine.scheduler.running) >= count:
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the requests never started")


async def test_a_high_band_request_displaces_a_low_one_that_recomputes_the_same_tokens(
        engine: Engine, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig,
) -> None:
    low_prompts = [prompt(30 + i, 14) for i in range(2)]
    lows = [engine.add_request(f"low{i}", ids, LONG, priority=LOW)
            for i, ids in enumerate(low_prompts)]
    await until_running(engine, 2)
    high_ids = prompt(40, 9)
    high = engine.add_request("high", high_ids, SHORT, priority=HIGH)
    results = await asyncio.gather(*(collect(q) for q in (*lows, high)))

    high_tokens, high_final = results[2]
    low_finals = [final for _, final in results[:2]]
    assert sum(final.preemptions for final in low_finals) >= 1
    # distinct prompts: every hit is a preempted sequence finding its own blocks again
    assert engine.stats().prefix_cache_hits >= engine.config.block_size
    assert high_final.preemptions == 0
    # the high request finished while a low one still had tokens to write
    assert high_final.timings is not None
    assert any(f.timings is not None and f.timings.finished is not None
               and f.timings.finished > high_final.timings.finished for f in low_finals)
    expected = [reference.greedy(tiny_state, tiny_config, ids, LONG.max_tokens)
                for ids in low_prompts]
    if engine.runner.device.type == "cpu":
        assert [tokens for tokens, _ in results[:2]] == expected
        assert high_tokens == reference.greedy(tiny_state, tiny_config, high_ids, 6)
    else:  # the same engine alone is the reference where float64 is not the arithmetic
        alone = [await collect(engine.add_request(f"alone{i}", ids, LONG, priority=LOW))
                 for i, ids in enumerate(low_prompts)]
        assert [tokens for tokens, _ in results[:2]] == [tokens for tokens, _ in alone]
    stats = {band.band: band for band in engine.stats().bands}
    assert stats[LOW].preemptions >= 1 and stats[HIGH].preemptions == 0


async def test_under_fcfs_a_high_band_request_waits_its_turn(tiny_dir: Path) -> None:
    model = load_model(tiny_dir, dtype=torch.float64, progress=None)
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=2,
                          scheduling_policy="fcfs")
    engine = Engine(model, Tokenizer.from_dir(tiny_dir), config, eos_token_ids=())
    engine.start()
    try:
        lows = [engine.add_request(f"low{i}", prompt(50 + i, 10), LONG, priority=LOW)
                for i in range(2)]
        await until_running(engine, 2)
        high = engine.add_request("high", prompt(60, 9), SHORT, priority=HIGH)
        results = await asyncio.gather(*(collect(q) for q in (*lows, high)))
    finally:
        engine.stop()
    assert all(final.preemptions == 0 for _, final in results)
    timings = [final.timings for _, final in results]
    assert all(t is not None for t in timings)
    first_low_done = min(t.finished or 0.0 for t in timings[:2] if t is not None)
    high = timings[2]
    assert high is not None and (high.first_scheduled or 0.0) >= first_low_done


@pytest.mark.parametrize("device", DEVICES)
async def test_a_batch_line_pauses_while_a_better_request_runs_and_writes_its_greedy_tokens(
        device: str, tiny_dir: Path, tiny_state: dict[str, torch.Tensor],
        tiny_config: LlamaConfig,
) -> None:
    dtype = torch.float64 if device == "cpu" else torch.float32
    model = load_model(tiny_dir, device=device, dtype=dtype, progress=None)
    # background steps of 8 tokens: the line's 14-token prompt is prefilled in two
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=4,
                          background_step_tokens=8)
    engine = Engine(model, Tokenizer.from_dir(tiny_dir), config, eos_token_ids=())
    engine.start()
    try:
        line_ids = prompt(70, 14)
        line = engine.add_request("line", line_ids, LONG, priority=BATCH)
        line_times: list[float] = []
        first = await line.get()
        line_times.append(first.time)
        high = engine.add_request("high", prompt(71, 9), SHORT, priority=HIGH)
        tokens, final = list(first.token_ids), first
        while not final.finished:
            final = await line.get()
            tokens += final.token_ids
            line_times.append(final.time)
        _, high_final = await collect(high)
        alone = None if device == "cpu" else await collect(
            engine.add_request("alone", line_ids, LONG, priority=BATCH))
    finally:
        engine.stop()
    assert final.preemptions == 0  # paused, its blocks kept: nothing recomputed
    timings = high_final.timings
    assert timings is not None and timings.first_scheduled is not None
    assert timings.finished is not None
    # no step wrote a token for the line while the better request was in the engine
    assert not [t for t in line_times if timings.first_scheduled < t < timings.finished]
    assert any(t > timings.finished for t in line_times)
    if alone is None:
        assert tokens == reference.greedy(tiny_state, tiny_config, line_ids, LONG.max_tokens)
    else:
        assert tokens == alone[0]
