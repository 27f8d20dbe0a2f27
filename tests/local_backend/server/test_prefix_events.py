"""`GET /v1/prefix_events`: a router that names prompts by its own prefix blocks
(`x-routegate-prefix-blocks`) follows exactly which of them this server holds."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from local_backend.server import prefix_tags
from routing import prefix_index
from tests.local_backend.server.conftest import Served, ServeFactory

SYSTEM = "You are a careful assistant who answers briefly. " * 3
BLOCK_CHARS = 32


def messages(user: str, system: str = SYSTEM) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def ask(served: Served, msgs: list[dict[str, Any]], salt: str | None = None,
              header: str = str(BLOCK_CHARS)) -> tuple[int, Any]:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 1, "messages": msgs}
    if salt is not None:
        body["cache_salt"] = salt
    async with aiohttp.ClientSession() as session, session.post(
            served.url + "/chat/completions", json=body,
            headers={prefix_tags.HEADER: header}) as response:
        return response.status, await response.json()


async def log(served: Served, after: int = 0, epoch: str | None = None) -> dict[str, Any]:
    query = {"after": str(after)} | ({"epoch": epoch} if epoch else {})
    async with aiohttp.ClientSession() as session, session.get(
            served.url + "/prefix_events", params=query) as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


def gateway_names(msgs: list[dict[str, Any]], salt: str | None = None) -> list[str]:
    text = prefix_index.prompt_text(msgs)
    return [f"{h:016x}" for h in prefix_index.block_hashes(text, BLOCK_CHARS, salt)]


async def test_the_gateways_names_for_a_served_prompt_are_reported_stored(
        serve: ServeFactory) -> None:
    served = await serve(num_blocks=256)
    first = await log(served)
    assert first["reset"] and first["held"] == []
    msgs = messages("What is two plus two?")
    assert (await ask(served, msgs, salt="tenant-a"))[0] == 200
    page = await log(served, first["next"], first["epoch"])
    stored = [tag for held, tag in page["events"] if held]
    names = gateway_names(msgs, salt="tenant-a")
    # every full block but the ones reaching into the prompt's last partial token block
    assert stored and stored == names[:len(stored)] and len(stored) >= len(names) - 2
    assert all(not held for held, _ in page["events"][len(stored):])


async def test_evicted_names_are_reported_when_other_prompts_take_their_blocks(
        serve: ServeFactory) -> None:
    served = await serve(num_blocks=64, max_num_seqs=1)  # 256 tokens: about one prompt
    msgs = messages("first question")
    assert (await ask(served, msgs))[0] == 200
    start = await log(served)
    held_before = set(start["held"])
    assert held_before
    for i in range(3):  # other long prompts, one at a time: the first one's blocks go
        other = messages("another question", system=f"Other system {i}. " * 10)
        assert (await ask(served, other))[0] == 200
    page = await log(served, start["next"], start["epoch"])
    evicted = {tag for held, tag in page["events"] if not held}
    assert held_before <= evicted
    now = await log(served)
    assert not held_before & set(now["held"])


async def test_without_the_header_nothing_is_named(serve: ServeFactory) -> None:
    served = await serve(num_blocks=256)
    async with aiohttp.ClientSession() as session, session.post(
            served.url + "/chat/completions",
            json={"model": "tiny", "max_tokens": 1, "messages": messages("hi")}) as response:
        assert response.status == 200
    assert (await log(served))["held"] == []


@pytest.mark.parametrize("value", ["0", "-3", "abc", "٣", "99999999999"])
async def test_a_malformed_header_is_refused_by_name(serve: ServeFactory, value: str) -> None:
    served = await serve()
    status, body = await ask(served, messages("hi"), header=value)
    assert status == 400 and body["error"]["param"] == prefix_tags.HEADER


async def test_a_malformed_event_number_is_refused_by_name(serve: ServeFactory) -> None:
    served = await serve()
    async with aiohttp.ClientSession() as session, session.get(
            served.url + "/prefix_events", params={"after": "-1"}) as response:
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "after"


texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=80)
message = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant"]),
    "content": st.one_of(texts, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": texts}), max_size=3))})


@given(st.lists(message, max_size=5), st.integers(1, 64), st.none() | texts)
def test_the_engine_names_prompts_exactly_as_the_gateway_does(
        msgs: list[dict[str, Any]], block_chars: int, salt: str | None) -> None:
    text = prefix_index.prompt_text(msgs)
    assert prefix_tags.prompt_text(msgs) == text
    assert prefix_tags.block_hashes(text, block_chars, salt) == \
        prefix_index.block_hashes(text, block_chars, salt)
