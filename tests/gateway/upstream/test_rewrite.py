"""The body sent upstream: the client's bytes, only `model` (and stream_options) changed."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.rewrite import upstream_body


def _rewrite(raw: bytes, name: str = "gpt-4o-mini", usage: bool = False) -> bytes:
    return upstream_body(raw, orjson.loads(raw), name, add_include_usage=usage)


def test_only_the_model_value_changes_byte_for_byte() -> None:
    raw = b'{"messages":[{"role":"user","content":"x"}],  "model" :\t"chat" ,"n":1.50}'
    assert _rewrite(raw) == raw.replace(b'"chat"', b'"gpt-4o-mini"')


def test_an_unchanged_model_forwards_the_same_bytes_object() -> None:
    raw = b'{"model":"gpt-4o-mini","messages":[]}'
    assert _rewrite(raw) is raw


def test_escaped_quotes_in_the_model_value_are_skipped_correctly() -> None:
    raw = b'{"model":"a\\"b\\\\","x":1}'
    assert orjson.loads(_rewrite(raw)) == {"model": "gpt-4o-mini", "x": 1}


@pytest.mark.parametrize("raw", [
    b'{"model":"chat","tools":[{"parameters":{"properties":{"model":{"type":"string"}}}}]}',
    b'{"messages":[{"role":"user","content":"say \\"model\\": 1"}],"model":"chat"}',
    b'{"mod\\u0065l":"chat","metadata":{"model":"keep"}}',
])
def test_ambiguous_bodies_are_re_encoded_and_nested_models_kept(raw: bytes) -> None:
    sent = orjson.loads(_rewrite(raw))
    original = orjson.loads(raw)
    assert sent == {**original, "model": "gpt-4o-mini"}


def test_include_usage_is_added_when_the_client_did_not_ask() -> None:
    raw = b'{"model":"chat","stream":true}'
    assert orjson.loads(_rewrite(raw, usage=True)) == {
        "model": "gpt-4o-mini", "stream": True, "stream_options": {"include_usage": True}}


def test_include_usage_is_merged_into_existing_stream_options() -> None:
    raw = b'{"model":"chat","stream":true,"stream_options":{"include_usage":false,"x":1}}'
    assert orjson.loads(_rewrite(raw, usage=True))["stream_options"] == {
        "include_usage": True, "x": 1}


def test_include_usage_replaces_null_stream_options() -> None:
    raw = b'{"model":"chat","stream":true,"stream_options":null}'
    assert orjson.loads(_rewrite(raw, usage=True))["stream_options"] == {"include_usage": True}


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=3),
    max_leaves=8), max_size=5), st.text(min_size=1, max_size=10), st.booleans(),
    st.booleans())
def test_the_rewrite_always_equals_the_body_with_model_replaced(
        body: dict[str, object], model: str, usage: bool, ascii_only: bool) -> None:
    body = {**body, "model": model}
    body.pop("stream_options", None)
    raw = json.dumps(body, ensure_ascii=ascii_only).encode()  # spaces and escapes, as SDKs send
    sent = orjson.loads(upstream_body(raw, body, "target", add_include_usage=usage))
    expected = {**body, "model": "target"}
    if usage:
        expected["stream_options"] = {"include_usage": True}
    assert sent == expected
