"""What the Anthropic translations cost, measured side by side in one run.

  per request   OpenAI chat → Messages request + Messages reply → chat.completion
                (Anthropic backends), and Messages request → chat + chat.completion →
                message (the /v1/messages surface), against orjson's parse + dump of
                the same body (what any proxy that reads its JSON pays)
  per event     one streamed text event through ChunkTranslator / EventEncoder, against
                the plain relay (SseRelay.feed) every OpenAI stream goes through
  end to end    one process: the gateway on loopback in front of fake backends;
                sequential non-streamed requests over keep-alive for
                OpenAI client → OpenAI backend, OpenAI client → Anthropic backend,
                Anthropic client (/v1/messages) → OpenAI backend

    .venv/bin/python bench/anthropic.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.api.messages_to_chat import EventEncoder, chat_request, message
from gateway.app import create_app
from gateway.core.sse import SseRelay
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from gateway.upstream.chat_to_anthropic import (
    ChunkTranslator,
    chat_completion,
    messages_request,
)
from policies.load import loads
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI

PROMPT = "Summarise the following text in one sentence. " * 20
CHAT = {"model": "chat", "max_tokens": 64, "messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]}
MESSAGES = {"model": "chat", "max_tokens": 64, "system": "Be brief.",
            "messages": [{"role": "user", "content": PROMPT}]}
REPLY = {"id": "msg_1", "type": "message", "model": "claude", "stop_reason": "end_turn",
         "content": [{"type": "text", "text": "A short summary of the text."}],
         "usage": {"input_tokens": 180, "output_tokens": 7}}
COMPLETION = chat_completion(REPLY, 0)
ANTHROPIC_EVENT = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                   b'"delta":{"type":"text_delta","text":" word"}}\n\n')
CHUNK_EVENT = (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
               b'"choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}\n\n')


def per_call_us(fn: Callable[[], object], seconds: float = 0.5) -> float:
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(200):
            fn()
        calls += 200
    return elapsed / calls * 1e6


def micro() -> None:
    raw_chat, raw_messages, raw_reply = (orjson.dumps(CHAT), orjson.dumps(MESSAGES),
                                         orjson.dumps(REPLY))
    print("per request (µs)")
    floor = per_call_us(lambda: (orjson.dumps(orjson.loads(raw_chat)),
                                 orjson.dumps(orjson.loads(raw_reply))))
    print(f"  parse + dump request and reply (floor)    {floor:7.1f}")
    backend = per_call_us(lambda: (
        orjson.dumps(messages_request(orjson.loads(raw_chat))),
        orjson.dumps(chat_completion(orjson.loads(raw_reply), 0))))
    print(f"  Anthropic backend translation             {backend:7.1f}")
    surface = per_call_us(lambda: (
        orjson.dumps(chat_request(orjson.loads(raw_messages))),
        orjson.dumps(message(orjson.loads(orjson.dumps(COMPLETION))))))
    print(f"  /v1/messages translation                  {surface:7.1f}")
    print("per streamed event (µs)")
    relay = SseRelay(strip_usage_chunk=False)
    print(f"  plain relay (SseRelay.feed)               {per_call_us(lambda: relay.feed(CHUNK_EVENT)):7.2f}")  # noqa: E501
    translator = ChunkTranslator(created=0, include_usage=False)
    translator.feed(b'data: {"type":"message_start","message":{"id":"m","model":"c"}}\n\n')
    print(f"  Anthropic events → chunks                 {per_call_us(lambda: translator.feed(ANTHROPIC_EVENT)):7.2f}")  # noqa: E501
    encoder = EventEncoder()
    print(f"  chunks → Messages events                  {per_call_us(lambda: encoder.feed(CHUNK_EVENT)):7.2f}")  # noqa: E501


async def end_to_end(requests: int = 400) -> None:
    openai_fake, anthropic_fake = FakeOpenAI(), FakeAnthropic()
    await openai_fake.start()
    await anthropic_fake.start()
    policy = loads(orjson.dumps({
        "version": 1,
        "backends": {"gpt": {"type": "openai", "url": openai_fake.url, "models": {"m": {}}},
                     "claude": {"type": "anthropic", "url": anthropic_fake.url,
                                "models": {"c": {}}}},
        "routes": {"openai": {"targets": ["gpt/m"]}, "anthropic": {"targets": ["claude/c"]}},
        "defaults": {"limits": {"requests_per_minute": 10**7, "tokens_per_minute": 10**9}},
        "auth": {"anonymous": {"enabled": True}}}).decode(), environ={})
    runner = GatewayRunner(create_app(policy, Settings(port=0, supervise=False)),
                           access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("OpenAI client → OpenAI backend", "/v1/chat/completions", {**CHAT, "model": "openai"}),
        ("OpenAI client → Anthropic backend", "/v1/chat/completions",
         {**CHAT, "model": "anthropic"}),
        ("Anthropic client → OpenAI backend", "/v1/messages", {**MESSAGES, "model": "openai"}),
    ]
    print(f"end to end, {requests} sequential requests each (ms per request, p50)")
    async with aiohttp.ClientSession() as session:
        for label, path, body in cases:
            data = orjson.dumps(body)
            for _ in range(20):  # warm up connections and caches
                async with session.post(base + path, data=data) as response:
                    await response.read()
            times = []
            for _ in range(requests):
                start = time.perf_counter()
                async with session.post(base + path, data=data) as response:
                    await response.read()
                    assert response.status == 200, await response.text()
                times.append(time.perf_counter() - start)
            times.sort()
            print(f"  {label:36s} {times[len(times) // 2] * 1000:6.3f}")
    await runner.cleanup()
    await openai_fake.stop()
    await anthropic_fake.stop()


def main() -> int:
    micro()
    asyncio.run(end_to_end())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
