"""One translator per (client API, backend API) pair; the identity where both are the same.

    client ╲ backend   chat (type: openai)      messages (type: anthropic)    responses (native)
    chat               as written               chat → messages               –
    messages           messages → chat          as written                    –
    responses          responses → chat         responses → chat → messages   as written

A backend gets a request in the client's own API whenever it speaks it (`as written`:
the client's bytes, only `model` changed, so fields a translation would drop —
`thinking`, `cache_control`, `metadata`, built-in tools — reach it), and its answer
goes back unchanged. Otherwise the request goes through the chat-completions pivot:
the client's API becomes a chat body when the request is parsed (`Dialect.request`,
made once for routing, limits and every candidate), and the backend's adapter makes
its own API of that (`Upstream.prepare`); the answer comes back the same way reversed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.api import messages_to_chat, responses_request
from gateway.upstream import chat_to_anthropic
from gateway.upstream.anthropic import MESSAGES_PATH
from gateway.upstream.rewrite import upstream_body
from policies.schema import Backend

Body = dict[str, Any]


class Api(StrEnum):
    CHAT = "chat"  # OpenAI chat completions: the pivot
    MESSAGES = "messages"  # Anthropic Messages
    RESPONSES = "responses"  # OpenAI Responses


@dataclass(frozen=True, slots=True)
class AsWritten:
    """The identity translator: the client's bytes at the backend's `path` (relative to
    its API root), with only `model` made the backend's name for it."""

    path: str

    def request(self, raw: bytes, body: Body, model: str) -> tuple[str, bytes]:
        return self.path, upstream_body(raw, body, model, add_include_usage=False)


@dataclass(frozen=True, slots=True)
class ThroughChat:
    """Through the chat pivot: `to_chat` makes a chat body of the client's (None: it is
    one), `from_chat` the backend's API of a chat body (None: the backend speaks chat)."""

    to_chat: Callable[..., Body] | None
    from_chat: Callable[[Body], Body] | None


Translator = AsWritten | ThroughChat

TRANSLATORS: Mapping[tuple[Api, Api], Translator] = {
    (Api.CHAT, Api.CHAT): AsWritten("/chat/completions"),
    (Api.CHAT, Api.MESSAGES): ThroughChat(None, chat_to_anthropic.messages_request),
    (Api.MESSAGES, Api.MESSAGES): AsWritten(MESSAGES_PATH),
    (Api.MESSAGES, Api.CHAT): ThroughChat(messages_to_chat.chat_request, None),
    (Api.RESPONSES, Api.RESPONSES): AsWritten("/responses"),
    (Api.RESPONSES, Api.CHAT): ThroughChat(responses_request.chat_request, None),
    (Api.RESPONSES, Api.MESSAGES): ThroughChat(responses_request.chat_request,
                                               chat_to_anthropic.messages_request),
}


def spoken(backend: Backend) -> tuple[Api, ...]:
    """The APIs `backend` speaks itself, the one its adapter translates to first."""
    if backend.type == "anthropic":
        return (Api.MESSAGES,)
    return (Api.CHAT, Api.RESPONSES) if backend.responses == "native" else (Api.CHAT,)


def translator(client: Api, backend: Backend) -> Translator:
    """How a request in the `client` API reaches `backend`."""
    apis = spoken(backend)
    return TRANSLATORS[(client, client if client in apis else apis[0])]
