"""`cache_salt` keeps callers' prefix caches apart: a prompt cached under one salt is a
miss under another, and a hit under the same one (as vLLM's `cache_salt`)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.local_backend.server.conftest import ServeFactory

PROMPT = "You are a careful assistant. " * 2


async def cached_tokens(client: openai.AsyncOpenAI, salt: str | None) -> int:
    extra: dict[str, Any] = {} if salt is None else {"cache_salt": salt}
    reply = await client.chat.completions.create(
        model="tiny", max_tokens=1, extra_body=extra,
        messages=[{"role": "system", "content": PROMPT}, {"role": "user", "content": "hi"}])
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0


async def test_a_prompt_cached_under_one_salt_is_a_miss_under_another(
        serve: ServeFactory) -> None:
    served = await serve(num_blocks=256)  # room for all four prompts: nothing evicted
    client = served.client()
    assert await cached_tokens(client, "a") == 0
    assert await cached_tokens(client, "b") == 0
    assert await cached_tokens(client, None) == 0
    assert await cached_tokens(client, "a") > 0


async def test_a_salt_that_is_not_a_short_string_is_refused_by_name(
        serve: ServeFactory) -> None:
    served = await serve()
    with pytest.raises(openai.BadRequestError) as refused:
        await cached_tokens(served.client(), "x" * 1000)
    assert refused.value.param == "cache_salt"
