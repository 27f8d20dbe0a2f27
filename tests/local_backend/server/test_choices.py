"""`n` > 1: several choices from one prompt, each its own sequence in the batch."""

from __future__ import annotations

from collections import defaultdict

from tests.local_backend.server.conftest import ServeFactory

CHAT = [{"role": "user", "content": "Say something."}]
SAMPLED = {"temperature": 1.0, "max_tokens": 8, "seed": 7}


async def test_each_choice_is_what_a_single_request_with_its_seed_gives(
        serve: ServeFactory) -> None:
    served = await serve()
    client = served.client()
    reply = await client.chat.completions.create(
        model="tiny", messages=CHAT, n=3, extra_body={"ignore_eos": True}, **SAMPLED)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    for index, text in enumerate(texts):
        single = await client.chat.completions.create(
            model="tiny", messages=CHAT, extra_body={"ignore_eos": True},
            **{**SAMPLED, "seed": 7 + index})
        assert single.choices[0].message.content == text
        prompt_tokens = single.usage.prompt_tokens if single.usage else None
    assert len(set(texts)) > 1  # different seeds: different samples
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 3 * 8
    assert reply.usage.prompt_tokens == prompt_tokens  # the prompt counts once
    metrics = reply.model_extra["metrics"]
    assert metrics["completion_tokens"] == 3 * 8
    assert metrics["inference_ms"] <= metrics["server_total_ms"]


async def test_a_stream_tags_chunks_with_their_choice_and_ends_with_one_usage(
        serve: ServeFactory) -> None:
    served = await serve()
    client = served.client()
    stream = await client.chat.completions.create(
        model="tiny", messages=CHAT, n=2, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}, **SAMPLED)
    chunks = [chunk async for chunk in stream]
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    roles = set()
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        if choice.delta.role:
            roles.add(choice.index)
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index].append(choice.finish_reason)
    assert roles == {0, 1} and finishes == {0: ["length"], 1: ["length"]}
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == 2 * 8
    whole = await client.chat.completions.create(
        model="tiny", messages=CHAT, n=2, extra_body={"ignore_eos": True}, **SAMPLED)
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]


async def test_completions_take_n_too_and_every_choice_frees_its_blocks(
        serve: ServeFactory) -> None:
    served = await serve(num_blocks=256)
    reply = await served.client().completions.create(
        model="tiny", prompt="Once upon a time", n=4, extra_body={"ignore_eos": True},
        **SAMPLED)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert served.engine.blocks.num_free == served.engine.blocks.num_blocks

