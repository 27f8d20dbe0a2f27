"""The SSE relay understands all three line endings of the SSE specification (CRLF, LF
and a bare CR), mixed within one stream and split anywhere between network reads."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.sse import SseRelay

CONTENT = (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
           b": keep-alive\n\n"
           b'event: message\ndata: {"choices":[{"index":0,"delta":{"content":"b"},'
           b'"finish_reason":"stop"}]}\n\n')
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"
ENDINGS = (b"\r\n", b"\n", b"\r")


def test_bare_cr_framing_is_understood() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    out = relay.feed((CONTENT + USAGE + DONE).replace(b"\n", b"\r"))
    assert out == CONTENT and relay.done and relay.usage is not None


def test_a_read_ending_on_a_cr_forwards_its_event_at_once() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    event = CONTENT.split(b"\n\n")[0]
    assert relay.feed(event + b"\r\n\r") == event + b"\n\n"  # not held for the next read
    assert relay.feed(b"\n" + DONE) == b"" and relay.done


@settings(max_examples=200, deadline=None)
@given(endings=st.lists(st.sampled_from(ENDINGS), min_size=16, max_size=16),
       cuts=st.lists(st.integers(0, 400), max_size=6))
def test_any_mix_of_line_endings_split_anywhere_relays_the_same_events(
        endings: list[bytes], cuts: list[int]) -> None:
    stream = b""
    for n, line in enumerate((CONTENT + USAGE + DONE).split(b"\n")[:-1]):
        ending = endings[n % len(endings)]
        if not line and ending == b"\n" and stream.endswith(b"\r"):
            ending = b"\r"  # a CR then a LF is one CRLF, not a blank line
        stream += line + ending
    relay = SseRelay(strip_usage_chunk=True)
    bounds = [0, *sorted(min(cut, len(stream)) for cut in cuts), len(stream)]
    out = b"".join(relay.feed(stream[start:end]) for start, end in pairwise(bounds))
    out += relay.leftover() or b""
    assert out == CONTENT
    assert relay.done and relay.complete and relay.usage == {"prompt_tokens": 1,
                                                             "completion_tokens": 2}
