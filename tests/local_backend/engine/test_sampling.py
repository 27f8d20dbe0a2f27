"""Sampling parameters: seeds, top-k, stop strings, EOS ids, max_tokens, logprobs."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from local_backend.engine.loop import RequestRejected
from local_backend.engine.params import SamplingParams
from local_backend.engine.sampler import Sampler
from local_backend.model.config import LlamaConfig
from tests.local_backend import reference
from tests.local_backend.conftest import EngineFactory
from tests.local_backend.engine.test_greedy_matches_reference import prompt, run


async def test_same_seed_gives_the_same_sample(make_engine: EngineFactory) -> None:
    engine = make_engine()
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=123, ignore_eos=True)
    first, _ = await run(engine, "a", prompt(1, 8), params)
    second, _ = await run(engine, "b", prompt(1, 8), params)
    third, _ = await run(engine, "c", prompt(1, 8), SamplingParams(
        max_tokens=12, temperature=1.0, seed=124, ignore_eos=True))
    assert first == second
    assert first != third


async def test_top_k_one_is_greedy(make_engine: EngineFactory) -> None:
    engine = make_engine()
    greedy, _ = await run(engine, "g", prompt(2, 8))
    top1, _ = await run(engine, "k", prompt(2, 8), SamplingParams(
        max_tokens=10, temperature=0.8, top_k=1, ignore_eos=True))
    assert greedy == top1


async def test_generation_ends_on_any_eos_id(make_engine: EngineFactory) -> None:
    engine = make_engine()
    free_run, _ = await run(engine, "free", prompt(4, 8))
    eos = free_run[3]
    params = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(999, eos))
    outputs = [o async for o in engine.generate("eos", prompt(4, 8), params)]
    assert [t for o in outputs for t in o.token_ids] == free_run[: free_run.index(eos) + 1]
    assert outputs[-1].finish_reason == "stop"


async def test_max_tokens_ends_with_length(make_engine: EngineFactory) -> None:
    engine = make_engine()
    outputs = [o async for o in engine.generate("len", prompt(5, 8), SamplingParams(
        max_tokens=3, temperature=0.0, ignore_eos=True))]
    assert outputs[-1].finish_reason == "length"
    assert outputs[-1].completion_tokens == 3


async def test_stop_string_truncates_text_and_is_never_streamed(make_engine: EngineFactory) -> None:
    engine = make_engine()
    free_text = "".join([o.text async for o in engine.generate(
        "free", prompt(6, 8), SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))])
    stop = free_text[5:8]
    assert len(stop) == 3
    outputs = [o async for o in engine.generate("stop", prompt(6, 8), SamplingParams(
        max_tokens=30, temperature=0.0, ignore_eos=True, stop=(stop,)))]
    text = "".join(o.text for o in outputs)
    assert text == free_text[: free_text.index(stop)]
    assert outputs[-1].finish_reason == "stop"


async def test_logprobs_end_where_a_stop_string_cuts_the_text(make_engine: EngineFactory) -> None:
    engine = make_engine()
    free = [o async for o in engine.generate("free", prompt(6, 8), SamplingParams(
        max_tokens=30, temperature=0.0, ignore_eos=True, logprobs=0))]
    starts = [sum(len(o.text) for o in free[:i]) for i in range(len(free))]
    free_text = "".join(o.text for o in free)
    stop = free_text[5:8]
    cut = free_text.index(stop)
    kept = [o.token_ids[0] for o, begin in zip(free, starts, strict=True) if begin < cut]
    assert 0 < len(kept) < len(free)

    outputs = [o async for o in engine.generate("stop", prompt(6, 8), SamplingParams(
        max_tokens=30, temperature=0.0, ignore_eos=True, stop=(stop,), logprobs=0))]
    assert [lp.token_id for o in outputs for lp in o.logprobs] == kept
    sent = ""
    for o in outputs:  # streamed, no logprob runs ahead of the text it belongs to
        sent += o.text
        reported = [lp.token_id for out in outputs[: outputs.index(o) + 1]
                    for lp in out.logprobs]
        assert all(starts[i] < len(sent) for i in range(len(reported)))


def test_logprobs_report_the_chosen_token_and_alternatives() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    tokens, lps = Sampler().sample(logits, ["r"], [SamplingParams(temperature=0.0, logprobs=2)])
    assert tokens == [1]
    lp = lps[0]
    assert lp is not None
    expected = torch.log_softmax(logits[0], -1)
    assert math.isclose(lp.logprob, float(expected[1]), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == [1, 2]


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.tensor([[5.0, 4.9, -10.0, -10.0]])
    sampler = Sampler()
    params = SamplingParams(temperature=1.0, top_p=0.5, seed=0)
    drawn = {sampler.sample(logits, [f"r{i}"], [params])[0][0] for i in range(20)}
    assert drawn <= {0, 1}


async def test_generation_stops_at_the_context_the_cache_can_hold(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(num_blocks=8, block_size=4)  # 7 usable blocks: 28 tokens
    assert engine.max_model_len == 28
    outputs = [o async for o in engine.generate("long", prompt(8, 10), SamplingParams(
        max_tokens=100, temperature=0.0, ignore_eos=True))]
    assert outputs[-1].finish_reason == "length"
    assert outputs[-1].completion_tokens == 18


async def test_prompt_longer_than_the_context_is_rejected(make_engine: EngineFactory) -> None:
    engine = make_engine(num_blocks=8, block_size=4)
    with pytest.raises(RequestRejected, match="28 tokens"):
        engine.add_request("too-long", prompt(9, 30), SamplingParams())


async def test_stopping_the_engine_ends_every_request_in_flight(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(num_blocks=128)
    outputs = engine.add_request("cut", prompt(10, 8), SamplingParams(
        max_tokens=400, temperature=0.0, ignore_eos=True))
    await outputs.get()
    await asyncio.get_running_loop().run_in_executor(None, engine.stop)
    final = await asyncio.wait_for(outputs.get(), 5)
    while not final.finished:
        final = await asyncio.wait_for(outputs.get(), 5)
    assert final.finish_reason == "shutdown"
    assert engine.blocks.num_free == engine.blocks.num_blocks


async def test_frequency_and_presence_penalties_match_the_reference(
    make_engine: EngineFactory, tiny_state: dict[str, torch.Tensor], tiny_config: LlamaConfig
) -> None:
    ids = prompt(11, 8)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                            frequency_penalty=0.7, presence_penalty=0.4)
    tokens, _ = await run(make_engine(), "pen", ids, params)
    expected: list[int] = []
    for _ in range(12):  # OpenAI's formula, over the tokens generated so far
        row = reference.logits(tiny_state, tiny_config, ids + expected)[-1]
        counts = torch.bincount(torch.tensor(expected, dtype=torch.long),
                                minlength=row.shape[0]).to(row.dtype)
        row = row - 0.7 * counts - 0.4 * (counts > 0).to(row.dtype)
        expected.append(int(row.argmax()))
    assert tokens == expected
    assert tokens != reference.greedy(tiny_state, tiny_config, ids, 12)
