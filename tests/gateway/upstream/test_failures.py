"""Each kind of upstream failure, as the adapter makes it of a real local server behaving
that way, and what its kind says: retry it, count it against the target, tell the
client 502 or 504, label it for metrics."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import trustme
from aiohttp import web

from gateway.core.errors import UpstreamError, UpstreamTimeout
from gateway.core.failures import (
    ConnectRefused,
    ConnectTimeout,
    CredentialsRefused,
    MalformedResponse,
    Overloaded,
    PoolTimeout,
    RateLimited,
    ReadTimeout,
    ServerError,
    TlsRejected,
    UpstreamClosed,
    UpstreamFailure,
    retry_after_s,
)
from gateway.upstream.anthropic import AnthropicUpstream
from gateway.upstream.openai import OpenAIUpstream
from policies.schema import Backend
from tests.conftest import StartUpstream
from tests.fakes.anthropic_upstream import AnthropicBehaviour, FakeAnthropic
from tests.fakes.openai_upstream import Behaviour
from tests.fakes.raw_backend import CLOSE, Pause, Piece, RawBackend
from tests.waiting import until

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
MESSAGES = b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
QUICK = {"connect_s": 0.3, "first_byte_s": 0.3, "total_s": 5.0}


def backend(url: str, kind: str = "openai", **extra: Any) -> Backend:
    return Backend.model_validate({"type": kind, "url": url, "models": {"m": {}},
                                   "timeouts": QUICK, **extra})


async def failure_of(adapter: OpenAIUpstream, body: bytes = CHAT) -> UpstreamFailure:
    """What `adapter` raises for one request (the test fails if it answers)."""
    try:
        response = await adapter.open("/chat/completions", body)
    except UpstreamFailure as failure:
        return failure
    finally:
        await adapter.close()
    response.close()
    raise AssertionError(f"the backend answered HTTP {response.status}")


async def openai_failure(url: str) -> UpstreamFailure:
    return await failure_of(OpenAIUpstream("b", backend(url), url))


@pytest.fixture
async def raw() -> AsyncIterator[list[RawBackend]]:
    started: list[RawBackend] = []
    yield started
    for server in started:
        await server.stop()


async def raw_backend(started: list[RawBackend], pieces: Sequence[Piece]) -> str:
    server = RawBackend(lambda body: pieces)
    started.append(server)
    return await server.start()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_nothing_listening_is_connect_refused_and_worth_retrying() -> None:
    failure = await openai_failure(f"http://127.0.0.1:{free_port()}/v1")

    assert isinstance(failure, ConnectRefused) and failure.status is None
    assert failure.retryable and failure.counts_against_health and not failure.timed_out
    assert isinstance(failure.error, UpstreamError) and failure.error.status == 502
    assert failure.metric_reason == "connect_refused"


async def test_a_full_accept_queue_is_a_connect_timeout_that_is_not_retried() -> None:
    # A listener with a backlog of 0 whose one queued connection is never accepted:
    # the kernel drops further SYNs, so a connect waits until `connect_s` runs out.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        _, held = await asyncio.open_connection("127.0.0.1", port)
        try:
            failure = await openai_failure(f"http://127.0.0.1:{port}/v1")
        finally:
            held.close()

    assert isinstance(failure, ConnectTimeout)
    assert failure.timed_out and not failure.retryable and failure.counts_against_health
    assert isinstance(failure.error, UpstreamTimeout) and failure.error.status == 504


async def test_a_certificate_no_trusted_authority_signed_is_tls_rejected() -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(context)  # a CA nobody trusts
    runner = web.AppRunner(web.Application(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    try:
        failure = await openai_failure(f"https://127.0.0.1:{runner.addresses[0][1]}/v1")
    finally:
        await runner.cleanup()

    assert isinstance(failure, TlsRejected) and "TLS verification" in failure.message
    assert not failure.retryable and failure.counts_against_health  # it would fail again


async def test_no_free_connection_in_time_is_a_pool_timeout(raw: list[RawBackend]) -> None:
    url = await raw_backend(raw, [Pause(1.0)])
    adapter = OpenAIUpstream("b", backend(url, max_connections=1, timeouts={
        **QUICK, "first_byte_s": 2.0, "pool_wait_s": 0.2}), url)
    holding = asyncio.ensure_future(adapter.open("/chat/completions", CHAT))
    await until(lambda: raw[-1].requests == 1)  # the one connection is taken

    failure = await failure_of(adapter)

    holding.cancel()
    await asyncio.gather(holding, return_exceptions=True)
    assert isinstance(failure, PoolTimeout) and failure.timed_out
    assert not failure.retryable and failure.error.status == 504


async def test_silence_past_first_byte_is_a_read_timeout(raw: list[RawBackend]) -> None:
    url = await raw_backend(raw, [Pause(2.0)])
    started = time.monotonic()

    failure = await openai_failure(url)

    assert isinstance(failure, ReadTimeout) and time.monotonic() - started < 1.5
    assert failure.timed_out and not failure.retryable and failure.counts_against_health
    assert failure.metric_reason == "read_timeout"


async def test_a_connection_closed_before_any_answer_is_upstream_closed_and_retried(
        raw: list[RawBackend]) -> None:
    failure = await openai_failure(await raw_backend(raw, [CLOSE]))

    assert isinstance(failure, UpstreamClosed)
    assert failure.retryable and failure.counts_against_health
    assert failure.metric_reason == "upstream_closed"


async def test_an_answer_that_is_not_http_is_malformed_and_not_retried(
        raw: list[RawBackend]) -> None:
    failure = await openai_failure(await raw_backend(
        raw, [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", Pause(1.0)]))

    assert isinstance(failure, MalformedResponse)
    assert not failure.retryable and failure.counts_against_health
    assert failure.metric_reason == "malformed_response"


async def test_a_429_is_rate_limited_retried_only_with_advice_and_no_fault(
        start_upstream: StartUpstream) -> None:
    fake = await start_upstream(Behaviour(status=429, retry_after="2"))

    failure = await openai_failure(fake.url)

    assert isinstance(failure, RateLimited) and failure.status == 429
    assert failure.retry_after_s == 2.0
    assert failure.retryable and failure.needs_advice and not failure.counts_against_health
    assert b"fails with 429" in failure.body  # its message, for the client's summary


async def test_a_503_is_overloaded_and_worth_retrying(start_upstream: StartUpstream) -> None:
    failure = await openai_failure((await start_upstream(Behaviour(status=503))).url)

    assert isinstance(failure, Overloaded) and failure.status == 503
    assert failure.retryable and failure.counts_against_health
    assert failure.metric_reason == "overloaded"


async def test_anthropics_529_overloaded_error_is_overloaded_too() -> None:
    fake = FakeAnthropic(AnthropicBehaviour(status=529))
    url = await fake.start()
    try:
        failure = await failure_of(AnthropicUpstream("a", backend(url, "anthropic"), url),
                                   MESSAGES)
    finally:
        await fake.stop()

    assert isinstance(failure, Overloaded) and failure.status == 529
    assert b"overloaded_error" in failure.body


async def test_a_500_is_a_server_error_counted_but_not_retried(
        start_upstream: StartUpstream) -> None:
    failure = await openai_failure((await start_upstream(Behaviour(status=500))).url)

    assert isinstance(failure, ServerError)
    assert not failure.retryable and failure.counts_against_health
    assert failure.metric_reason == "server_error"


async def test_the_gateways_key_refused_is_no_fault_of_the_backend_nor_the_client(
        start_upstream: StartUpstream) -> None:
    failure = await openai_failure((await start_upstream(Behaviour(status=401))).url)

    assert isinstance(failure, CredentialsRefused)
    assert "gateway's credentials" in failure.message  # not "your key is wrong"
    assert not failure.retryable and not failure.counts_against_health
    assert failure.error.status == 502


async def test_a_400_is_not_a_failure_but_the_answer(start_upstream: StartUpstream) -> None:
    fake = await start_upstream(Behaviour(status=400))
    adapter = OpenAIUpstream("b", backend(fake.url), fake.url)

    response = await adapter.open("/chat/completions", CHAT)

    assert response.status == 400  # relayed to the client by the pipeline
    response.close()
    await adapter.close()


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"Retry-After": "2"}, 2.0),
    ({"retry-after-ms": "250"}, 0.25),
    ({"Retry-After": "soon"}, None),
    ({}, None),
])
def test_retry_after_reads_seconds_and_milliseconds(headers: dict[str, str],
                                                    seconds: float | None) -> None:
    assert retry_after_s(headers) == seconds


def test_retry_after_reads_an_http_date() -> None:
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    seconds = retry_after_s({"Retry-After": later})
    assert seconds is not None and 28 < seconds <= 30


def test_every_kind_has_its_own_metric_reason() -> None:
    kinds: list[type[Any]] = []
    pending: list[type[Any]] = [UpstreamFailure]
    while pending:
        kind = pending.pop()
        kinds.append(kind)
        pending.extend(kind.__subclasses__())
    reasons = [kind.metric_reason for kind in kinds if kind is not UpstreamFailure]
    assert len(reasons) == len(set(reasons)) >= 12
