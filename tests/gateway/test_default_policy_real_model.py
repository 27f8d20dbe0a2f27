"""`make run` as shipped: `routegate serve` with the default policy launches the bundled
SmolLM2 GGUF, and the real model answers a factual question through the gateway, read
with the official openai SDK, as one JSON response and as a stream."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from policies.load import load
from tests.ports import free_port

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
DEFAULT_POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if key not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ROUTEGATE_POLICY")}
    env["ROUTEGATE_CACHE_DIR"] = str(tmp_path)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--port", str(port), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(300):
            while True:  # /readyz turns 200 once the launched local backend answers
                assert process.returncode is None, "routegate serve exited during start-up"
                try:
                    async with session.get(url + "/readyz") as ready:
                        if ready.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
        yield url
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="anything-from-loopback",
                              timeout=60, max_retries=0)


async def test_the_default_policy_answers_a_factual_question_json_and_streamed(
    gateway: str,
) -> None:
    async with client(gateway) as api:
        reply = await api.chat.completions.create(model="chat", messages=QUESTION,
                                                  max_tokens=24, temperature=0)
        stream = await api.chat.completions.create(
            model="local/smollm2-135m-instruct", messages=QUESTION, max_tokens=24,
            temperature=0, stream=True)
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream
                  if chunk.choices]
    assert reply.model == "smollm2-135m-instruct"
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens > 10
    assert len([p for p in pieces if p]) > 3  # token by token, not one block
    assert "Paris" in "".join(pieces)


async def test_the_readmes_first_request_is_answered_within_budget_the_moment_readyz_says_ready(
    gateway: str,
) -> None:
    """Ready means a request works: the launched backend has warmed up before /readyz
    said so (the fixture returns at its first 200), so the README's first curl, as
    written (no temperature, no max_tokens), is answered right within the route's budget."""
    budget = load(DEFAULT_POLICY).routes["chat"].latency_budget
    assert budget.ttft_ms is not None
    body = {"model": "chat", "messages": QUESTION}
    started = time.monotonic()
    async with aiohttp.ClientSession() as session, session.post(
            gateway + "/v1/chat/completions", json=body) as response:
        reply = await response.json()
    elapsed_ms = (time.monotonic() - started) * 1000
    assert response.status == 200, reply
    assert "Paris" in reply["choices"][0]["message"]["content"]
    # a non-streamed answer is due within the first-token budget (policies/default.yaml)
    assert elapsed_ms < budget.ttft_ms
