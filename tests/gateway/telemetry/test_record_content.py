"""Prompt and completion text in a trace: only when the policy records content."""

from __future__ import annotations

import logging

import pytest

from gateway.core.content import MAX_CHARS, TRUNCATED, StreamText, completion_text
from tests.conftest import StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour
from tests.gateway.telemetry.conftest import StartTraced
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver
from tests.gateway.telemetry.test_gateway_telemetry import CHAT, PROMPT, post

REPLY = "the marmalade ships on friday at dawn"


def recording(url: str, on: bool) -> dict[str, object]:
    return single_backend_policy(url, compliance={"record_content": on})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_root_span_carries_prompt_and_completion_when_the_policy_says_so(
    stream: bool, start_upstream: StartUpstream, start_traced: StartTraced,
    otlp_receiver: tuple[OtlpReceiver, str], caplog: pytest.LogCaptureFixture,
) -> None:
    receiver, otlp_url = otlp_receiver
    upstream = await start_upstream(Behaviour(reply=REPLY))
    traced = await start_traced(recording(upstream.url, True), otlp_url)
    caplog.set_level(logging.INFO)
    status, _, _ = await post(traced.gateway.url, {**CHAT, "stream": stream})
    assert status == 200
    await traced.flush()
    spans = await receiver.wait_for(lambda s: any(x.kind == "SERVER" for x in s))
    (root,) = [s for s in spans if s.kind == "SERVER"]
    assert PROMPT in root.attributes["gen_ai.prompt"]  # the messages, as JSON
    assert '"role":"user"' in root.attributes["gen_ai.prompt"]
    assert root.attributes["gen_ai.completion"] == REPLY
    assert PROMPT not in caplog.text and REPLY not in caplog.text  # never in logs


async def test_without_the_policy_no_span_carries_prompt_or_completion(
    start_upstream: StartUpstream, start_traced: StartTraced,
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, otlp_url = otlp_receiver
    upstream = await start_upstream(Behaviour(reply=REPLY))
    traced = await start_traced(recording(upstream.url, False), otlp_url)
    for stream in (False, True):
        assert (await post(traced.gateway.url, {**CHAT, "stream": stream}))[0] == 200
    await traced.flush()
    spans = await receiver.wait_for(lambda s: sum(x.kind == "SERVER" for x in s) == 2)
    for span in spans:
        text = repr(span.attributes)
        assert PROMPT not in text and REPLY not in text
        assert "gen_ai.prompt" not in span.attributes


def test_a_long_text_is_cut_and_marked() -> None:
    body = {"choices": [{"message": {"content": "x" * (MAX_CHARS + 10)}}]}
    text = completion_text(body)
    assert text is not None and text.endswith(TRUNCATED)
    assert len(text) == MAX_CHARS + len(TRUNCATED)
    stream = StreamText()
    for _ in range(3):
        stream.feed(b'data: {"choices":[{"delta":{"content":"' + b"y" * MAX_CHARS + b'"}}]}\n\n')
    streamed = stream.text()
    assert streamed is not None and streamed.endswith(TRUNCATED)


def test_stream_text_joins_the_deltas_and_skips_what_is_not_a_chunk() -> None:
    stream = StreamText()
    stream.feed(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
                b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n')
    stream.feed(b': a comment\n\ndata: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
                b"data: not json\n\ndata: [DONE]\n\n")
    assert stream.text() == "Hello"
    assert StreamText().text() is None
