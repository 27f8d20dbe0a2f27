"""One translator per (client API, backend API) pair, and the identity where both speak
the same API."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.translators import TRANSLATORS, Api, AsWritten, ThroughChat, translator
from policies.schema import Backend


def backend(kind: str, **extra: Any) -> Backend:
    return Backend.model_validate({"type": kind, "url": "http://127.0.0.1:1/v1",
                                   "models": {"m": {}}, **extra})


OPENAI = backend("openai")
NATIVE = backend("openai", responses="native")
ANTHROPIC = backend("anthropic")


@pytest.mark.parametrize(("client", "target", "path"), [
    (Api.CHAT, OPENAI, "/chat/completions"),
    (Api.MESSAGES, ANTHROPIC, "/messages"),
    (Api.RESPONSES, NATIVE, "/responses"),
    (Api.CHAT, NATIVE, "/chat/completions"),  # a native backend speaks chat as well
])
def test_a_backend_speaking_the_clients_api_gets_the_request_as_written(
        client: Api, target: Backend, path: str) -> None:
    assert translator(client, target) == AsWritten(path)


@pytest.mark.parametrize(("client", "target"), [
    (Api.CHAT, ANTHROPIC), (Api.MESSAGES, OPENAI), (Api.MESSAGES, NATIVE),
    (Api.RESPONSES, OPENAI), (Api.RESPONSES, ANTHROPIC),
])
def test_any_other_pair_goes_through_chat(client: Api, target: Backend) -> None:
    way = translator(client, target)
    assert isinstance(way, ThroughChat)
    assert (way.to_chat is None) == (client is Api.CHAT)  # chat clients need no first step
    assert (way.from_chat is None) == (target.type == "openai")


def test_every_pair_has_exactly_one_translator_and_same_api_pairs_the_identity() -> None:
    for (client, speaks), way in TRANSLATORS.items():
        assert isinstance(way, AsWritten) == (client is speaks)


def test_as_written_changes_only_the_model() -> None:
    raw = (b'{"model": "chat", "thinking": {"type": "enabled", "budget_tokens": 1024},'
           b' "max_tokens": 2048, "messages": []}')

    path, sent = AsWritten("/messages").request(raw, orjson.loads(raw), "claude-x")

    assert path == "/messages"
    assert sent == raw.replace(b'"chat"', b'"claude-x"')
