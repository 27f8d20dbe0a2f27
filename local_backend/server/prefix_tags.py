"""A router's names for prefixes of a prompt, so the engine can say which it holds.

A client that picks replicas by prefix (routegate's gateway, `pick: prefix` with
`precise: true`) sends `x-routegate-prefix-blocks: <block_chars>`. It names a prompt by
blocks of that many characters of its messages (role, a record separator, the text
parts, a unit separator, per message), each block's hash chained over every block
before it and seeded by the request's `cache_salt`. This module computes the same
names here (the wire contract: the gateway's side is `routing/prefix_index.py`, and a
test checks the two agree on generated prompts) and maps each to the prompt's token
blocks in proportion to its characters; the engine reports a name stored once those
blocks are cached and evicted once one of them leaves (engine/prefix_events.py).
`GET /v1/prefix_events` is where the client follows that log.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from hashlib import blake2b
from typing import Any

import orjson
from aiohttp import web

from local_backend.engine.prefix_events import PrefixEvents
from local_backend.server.errors import bad_request

HEADER = "x-routegate-prefix-blocks"
MAX_BLOCK_CHARS = 1 << 20
ROLE_MARK = "\x1e"
MESSAGE_MARK = "\x1f"


def prompt_text(messages: Sequence[Any]) -> str:
    out: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        out.append(str(message.get("role", "")))
        out.append(ROLE_MARK)
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(part["text"] for part in content
                       if isinstance(part, Mapping) and isinstance(part.get("text"), str))
        out.append(MESSAGE_MARK)
    return "".join(out)


def block_hashes(text: str, block_chars: int, salt: str | None) -> list[int]:
    parent = b"" if salt is None else blake2b(salt.encode(), digest_size=8).digest()
    out = []
    for start in range(0, len(text) - block_chars + 1, block_chars):
        parent = blake2b(parent + text[start:start + block_chars].encode(),
                         digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


def block_chars_asked(headers: Mapping[str, str]) -> int | None:
    """The header's block size, None without it; a 400 naming the header if malformed."""
    value = headers.get(HEADER)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not 0 < int(value) <= MAX_BLOCK_CHARS:
        raise bad_request(f"{HEADER} must be a whole number of characters from 1 to "
                          f"{MAX_BLOCK_CHARS}", HEADER)
    return int(value)


def prefix_tags(text: str, salt: str | None, block_chars: int, prompt_tokens: int,
                block_size: int) -> tuple[tuple[tuple[int, int], ...], list[int]]:
    """(tag, token blocks it needs) for each name the engine can hold, in order, and the
    names it cannot (they reach into the prompt's last, partly filled token block)."""
    hashes = block_hashes(text, block_chars, salt)
    full_blocks = prompt_tokens // block_size
    storable: list[tuple[int, int]] = []
    never: list[int] = []
    for i, tag in enumerate(hashes):
        ends_at_token = -(-prompt_tokens * (i + 1) * block_chars // len(text))
        needed = -(-ends_at_token // block_size)
        if needed <= full_blocks:
            storable.append((tag, needed))
        else:
            never.append(tag)
    return tuple(storable), never


def events_handler(events: PrefixEvents) -> Callable[[web.Request], Awaitable[web.Response]]:
    """`GET /v1/prefix_events?after=N&epoch=E`: the log after event N of this engine's
    life E (`{"epoch", "next", "events": [[1 stored | 0 evicted, "tag as 16 hex"], …]}`),
    or `"reset": true` with `"held"`, every tag held now, when E is not this life or N
    fell out of the log. Start with no parameters."""

    async def prefix_events(request: web.Request) -> web.Response:
        after_text = request.query.get("after", "0")
        if not after_text.isascii() or not after_text.isdigit() or len(after_text) > 18:
            raise bad_request("'after' must be an event number (a whole number)", "after")
        page = events.since(int(after_text), request.query.get("epoch"))
        body: dict[str, Any] = {"epoch": page.epoch, "next": page.next,
                                "events": [[int(held), f"{tag:016x}"]
                                           for held, tag in page.events]}
        if page.reset:
            body["reset"] = True
            body["held"] = [f"{tag:016x}" for tag in page.held or ()]
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    return prefix_events
