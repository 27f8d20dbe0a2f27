"""The SSE relay: pass events through, capture usage, hold back [DONE]."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.sse import MalformedEvent, SseRelay

CONTENT = b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
USAGE = (b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1,'
         b'"total_tokens":3}}\n\n')
DONE = b"data: [DONE]\n\n"


def test_whole_events_pass_through_unchanged() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    assert relay.feed(CONTENT + CONTENT) == CONTENT + CONTENT


def test_a_split_event_is_forwarded_once_complete() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    assert relay.feed(CONTENT[:10]) == b""
    assert relay.feed(CONTENT[10:] + CONTENT[:5]) == CONTENT
    assert relay.feed(CONTENT[5:]) == CONTENT


def test_usage_is_captured_and_kept_when_the_client_asked() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    assert relay.feed(CONTENT + USAGE + DONE) == CONTENT + USAGE
    assert relay.usage == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    assert relay.done


def test_usage_only_chunk_is_stripped_when_the_gateway_asked_for_it() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    assert relay.feed(CONTENT + USAGE) == CONTENT
    assert relay.usage is not None and relay.usage["total_tokens"] == 3


def test_crlf_framing_is_understood() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    out = relay.feed((CONTENT + USAGE + DONE).replace(b"\n", b"\r\n"))
    assert out == CONTENT and relay.done


def test_comments_and_other_fields_pass_through() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    event = b": keep-alive\n\nevent: ping\ndata: {}\n\n"
    assert relay.feed(event) == event


def test_an_unterminated_tail_is_completed_as_an_event() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    relay.feed(b'data: {"x":1}')
    assert relay.leftover() == b'data: {"x":1}\n\n'


def test_an_unterminated_usage_chunk_is_still_counted_and_stripped() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    relay.feed(CONTENT + USAGE.rstrip(b"\n"))
    assert relay.leftover() == b"" and relay.usage is not None


def test_a_partial_event_dropped_after_a_break_is_never_forwarded() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    relay.feed(b'data: {"choices":[{"delta":{"content":"a')
    relay.drop_partial()
    assert relay.leftover() == b""


def test_crlf_framing_split_anywhere_between_reads_is_understood() -> None:
    stream = (CONTENT + USAGE + DONE).replace(b"\n", b"\r\n")
    for cut in range(1, len(stream)):
        relay = SseRelay(strip_usage_chunk=True)
        out = relay.feed(stream[:cut]) + relay.feed(stream[cut:])
        assert (out, relay.done, relay.usage is not None) == (CONTENT, True, True), cut


def test_a_tail_cut_in_the_middle_of_its_json_is_not_forwarded() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    assert relay.feed(CONTENT + b'data: {"choices":[{"delta":{"content":"h') == CONTENT
    assert relay.leftover() is None


def test_a_malformed_event_stops_the_relay_after_the_good_ones_before_it() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    with pytest.raises(MalformedEvent, match="not a JSON object") as raised:
        relay.feed(CONTENT + b"data: {not json\n\n" + CONTENT)
    assert raised.value.forward == CONTENT


def test_a_line_that_is_no_sse_field_is_malformed() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    with pytest.raises(MalformedEvent, match="not an SSE field"):
        relay.feed(b"\x00\x01garbage\n\n")


def test_an_event_still_arriving_past_the_cap_is_refused_before_it_completes() -> None:
    relay = SseRelay(strip_usage_chunk=False, max_event_bytes=100)
    assert relay.feed(b'data: {"a":"' + b"x" * 60) == b""
    with pytest.raises(MalformedEvent, match="max_event_bytes"):
        relay.feed(b"x" * 60)


def test_a_stream_is_complete_after_done_a_finish_reason_or_its_own_error_event() -> None:
    finish = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
    error = b'data: {"error":{"message":"overloaded"}}\n\n'
    for ending in (DONE, finish, error):
        relay = SseRelay(strip_usage_chunk=False)
        relay.feed(CONTENT + ending)
        assert relay.complete
    cut = SseRelay(strip_usage_chunk=False)
    cut.feed(CONTENT + CONTENT)
    assert not cut.complete


TOKEN = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


@given(st.lists(st.sampled_from([TOKEN, b'data: {"x": [1, 2]}\n\n', b"data: {\n\n",
                                  b"data: {}\n\n", b"data: {x}\n\n", b": ping\n\n", USAGE, DONE]),
                min_size=1, max_size=8),
       st.data())
def test_what_is_forwarded_does_not_depend_on_how_the_stream_was_split_into_reads(
        events: list[bytes], data: st.DataObject) -> None:
    """Events read one by one, or all at once, or split anywhere: the same bytes are
    forwarded, the same event stops the relay, the same usage is read."""
    stream = b"".join(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

    def relay_all(pieces: list[bytes]) -> tuple[bytes, bool, object]:
        relay, out = SseRelay(strip_usage_chunk=False), b""
        try:
            for piece in pieces:
                out += relay.feed(piece)
        except MalformedEvent as exc:
            return out + exc.forward, True, relay.usage
        return out, False, relay.usage

    assert relay_all(reads) == relay_all([stream]) == relay_all(events)
