r"""The request body sent upstream: the client's own bytes with only `model` changed.

Splicing the bytes keeps whatever the client wrote (field order, number formatting,
fields the gateway has never heard of) and avoids re-encoding a body that can be
megabytes of prompt. The splice is used only when it is unambiguous — exactly one
`"model"` token in the whole body, preceded by `{` or `,`, holding the value the parser
saw, and no `\u` escape anywhere (one could spell the real key `"mod\u0065l"` and make
the one literal token a nested key) — and otherwise the parsed body is re-encoded with
orjson, which is always correct, just not byte-identical.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

_MODEL_KEY = b'"model"'
_WHITESPACE = b" \t\r\n"
_KEY_OPENERS = b"{,"
_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'


def _string_end(raw: bytes, start: int) -> int:
    """Index just past the JSON string literal whose opening quote is at `start`."""
    index = start + 1
    while True:
        index = raw.index(b'"', index)
        backslashes = 0
        while raw[index - 1 - backslashes] == 0x5C:  # count the `\` before this quote
            backslashes += 1
        index += 1
        if backslashes % 2 == 0:
            return index


def _splice_model(raw: bytes, model: str, upstream_name: str) -> bytes | None:
    if raw.count(_MODEL_KEY) != 1 or raw.find(b"\\u") >= 0:
        return None
    key = raw.index(_MODEL_KEY)
    before = key - 1
    while before >= 0 and raw[before] in _WHITESPACE:
        before -= 1
    if before < 0 or raw[before] not in _KEY_OPENERS:
        return None
    colon = key + len(_MODEL_KEY)
    while raw[colon] in _WHITESPACE:
        colon += 1
    if raw[colon] != 0x3A:  # ':'
        return None
    value = colon + 1
    while raw[value] in _WHITESPACE:
        value += 1
    if raw[value] != 0x22:  # '"': validation already made `model` a string
        return None
    end = _string_end(raw, value)
    if orjson.loads(raw[value:end]) != model:
        return None
    return raw[:value] + orjson.dumps(upstream_name) + raw[end:]


def upstream_body(raw: bytes, body: dict[str, Any], upstream_name: str, *,
                  add_include_usage: bool) -> bytes:
    """Bytes to send upstream.

    `add_include_usage`: the stream must report usage (`stream_options.include_usage`)
    although the client did not ask for it; the relay strips that chunk again.
    """
    if add_include_usage and "stream_options" in body:
        options = body["stream_options"] or {}  # `"stream_options": null` is allowed
        return orjson.dumps({**body, "model": upstream_name,
                             "stream_options": {**options, "include_usage": True}})
    spliced = None
    if body["model"] != upstream_name or add_include_usage:
        spliced = raw if body["model"] == upstream_name else _splice_model(raw, body["model"],
                                                                          upstream_name)
        if spliced is None:
            updated = {**body, "model": upstream_name}
            if add_include_usage:
                updated["stream_options"] = {"include_usage": True}
            return orjson.dumps(updated)
    else:
        return raw
    if add_include_usage:
        brace = spliced.index(b"{") + 1
        spliced = spliced[:brace] + _INCLUDE_USAGE + spliced[brace:]
    return spliced


def spliced_fields(fields: Mapping[str, Any]) -> bytes:
    """`fields` as the members `with_fields` splices in: `"name":value,` each."""
    return b"".join(orjson.dumps(name) + b":" + orjson.dumps(value) + b","
                    for name, value in fields.items())


def with_fields(encoded: bytes, body: Mapping[str, Any], fields: Mapping[str, Any],
                spliced: bytes) -> bytes:
    """`encoded` (the JSON object `body`, as `upstream_body` made it) with `fields` set:
    `spliced` (from `spliced_fields`) put in front when the client wrote none of them,
    the object re-encoded with them replaced otherwise."""
    if any(name in body for name in fields):
        return orjson.dumps({**orjson.loads(encoded), **fields})
    brace = encoded.index(b"{") + 1
    return encoded[:brace] + spliced + encoded[brace:]
