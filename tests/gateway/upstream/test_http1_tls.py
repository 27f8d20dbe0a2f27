"""https backends: real TLS servers on loopback with certificates from a throwaway CA
(trustme). The client verifies the chain and the server's name, as `ClientSession`
does; a policy's `ca_file` is how a private CA is trusted; an untrusted backend fails
at once with an error naming it."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import trustme
import yaml
from aiohttp import web

from gateway.core.deadline import Timeouts
from gateway.policy.admin import RELOADER
from gateway.settings import Settings
from gateway.upstream.http1 import Http1Client
from gateway.upstream.http1_errors import ConnectFailed
from tests.conftest import StartGateway, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI

RELAXED = Timeouts(connect_s=2.0, first_byte_s=5.0, total_s=10.0)
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
StartTls = Callable[..., Awaitable[int]]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_context(ca: trustme.CA, *names: str,
                   seen_names: list[str | None] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    if seen_names is not None:
        def record(_: ssl.SSLObject, name: str | None, __: ssl.SSLContext) -> None:
            seen_names.append(name)
        context.sni_callback = record
    return context


def trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@pytest.fixture
async def start_tls() -> AsyncIterator[StartTls]:
    """`await start_tls(app, context)`: the app served over TLS on 127.0.0.1; its port."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application, context: ssl.SSLContext) -> int:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        runners.append(runner)
        port: int = runner.addresses[0][1]
        return port

    yield start
    for runner in runners:
        await runner.cleanup()


def echo_app(peers: list[int]) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername")[1])
        return web.json_response({"secure": request.secure, "got": (await request.read()).decode()})

    app = web.Application()
    app.router.add_post("/{tail:.*}", echo)
    return app


async def _post(client: Http1Client, body: bytes = b"{}") -> Any:
    response = await client.post("/chat/completions", body)
    assert response.status == 200
    answer = orjson.loads(await response.read())
    response.release()
    return answer


async def test_a_request_succeeds_over_tls_when_the_ca_is_trusted(
        ca: trustme.CA, start_tls: StartTls) -> None:
    port = await start_tls(echo_app([]), server_context(ca, "127.0.0.1"))
    client = Http1Client(f"https://127.0.0.1:{port}/v1", max_connections=1,
                         timeouts=RELAXED, ssl_context=trusting(ca))
    assert await _post(client, b'{"n": 1}') == {"secure": True, "got": '{"n": 1}'}
    await client.close()


async def test_kept_alive_connections_are_reused_over_tls(
        ca: trustme.CA, start_tls: StartTls) -> None:
    peers: list[int] = []
    port = await start_tls(echo_app(peers), server_context(ca, "127.0.0.1"))
    client = Http1Client(f"https://127.0.0.1:{port}/v1", max_connections=2,
                         timeouts=RELAXED, ssl_context=trusting(ca))
    for _ in range(4):
        await _post(client)
    assert len(peers) == 4 and len(set(peers)) == 1
    await client.close()


async def test_the_host_name_is_sent_as_sni_and_matched_to_the_certificate(
        ca: trustme.CA, start_tls: StartTls) -> None:
    seen: list[str | None] = []
    port = await start_tls(echo_app([]), server_context(ca, "localhost", seen_names=seen))
    client = Http1Client(f"https://localhost:{port}/v1", max_connections=1,
                         timeouts=RELAXED, ssl_context=trusting(ca))
    assert (await _post(client))["secure"] is True
    assert seen == ["localhost"]
    await client.close()


async def test_a_trusted_certificate_for_another_name_is_refused(
        ca: trustme.CA, start_tls: StartTls) -> None:
    peers: list[int] = []
    port = await start_tls(echo_app(peers), server_context(ca, "backend.example"))
    client = Http1Client(f"https://127.0.0.1:{port}/v1", max_connections=1,
                         timeouts=RELAXED, ssl_context=trusting(ca))
    with pytest.raises(ConnectFailed) as failed:
        await client.post("/x", b"{}")
    assert isinstance(failed.value.os_error, ssl.SSLCertVerificationError)
    assert "mismatch" in str(failed.value.os_error.verify_message)
    assert peers == []
    await client.close()


async def test_an_untrusted_certificate_fails_at_once_and_frees_the_slot(
        ca: trustme.CA, start_tls: StartTls) -> None:
    port = await start_tls(echo_app([]), server_context(ca, "127.0.0.1"))
    # No context given: the system's CAs, which do not include the throwaway CA.
    client = Http1Client(f"https://127.0.0.1:{port}/v1", max_connections=1,
                         timeouts=RELAXED)
    loop = asyncio.get_running_loop()
    for _ in range(2):  # the failed attempt did not keep the only slot
        started = loop.time()
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED") as failed:
            await client.post("/x", b"{}")
        assert isinstance(failed.value.os_error, ssl.SSLCertVerificationError)
        assert loop.time() - started < 1.0
    await client.close()


async def test_a_server_that_never_answers_the_handshake_is_a_connect_timeout() -> None:
    accepted = asyncio.Event()

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # says nothing until the client gives up
        writer.close()

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Http1Client(f"https://127.0.0.1:{port}/v1", max_connections=1,
                         timeouts=Timeouts(connect_s=0.3, first_byte_s=5.0, total_s=10.0))
    started = asyncio.get_running_loop().time()
    with pytest.raises(aiohttp.ServerTimeoutError, match="Connect timeout"):
        await client.post("/x", b"{}")
    assert accepted.is_set() and asyncio.get_running_loop().time() - started < 1.5
    await client.close()
    server.close()
    await server.wait_closed()


def test_an_ssl_context_for_a_plain_http_url_is_refused(ca: trustme.CA) -> None:
    with pytest.raises(ValueError, match="https"):
        Http1Client("http://127.0.0.1:1/v1", max_connections=1, timeouts=RELAXED,
                    ssl_context=trusting(ca))


# --- through the gateway: the policy's `ca_file` -------------------------------------


async def _tls_openai_backend(ca: trustme.CA, start_tls: StartTls) -> tuple[FakeOpenAI, str]:
    fake = FakeOpenAI()
    port = await start_tls(fake.app, server_context(ca, "127.0.0.1"))
    return fake, f"https://127.0.0.1:{port}/v1"


async def _chat(gateway_url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            gateway_url + "/v1/chat/completions", json=CHAT) as response:
        return response.status, await response.json()


async def test_an_https_backend_signed_by_the_policys_ca_file_serves_requests(
        ca: trustme.CA, start_tls: StartTls, start_gateway: StartGateway,
        tmp_path: Path) -> None:
    fake, url = await _tls_openai_backend(ca, start_tls)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    policy = single_backend_policy(url)
    policy["backends"]["up"]["ca_file"] = str(ca_file)
    gateway = await start_gateway(policy)

    status, body = await _chat(gateway.url)

    assert status == 200 and body["choices"][0]["message"]["content"]
    assert len(fake.received) == 1


async def _serve_tls_on(port: int, context: ssl.SSLContext) -> tuple[FakeOpenAI, web.AppRunner]:
    fake = FakeOpenAI()
    runner = web.AppRunner(fake.app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    return fake, runner


async def test_a_rotated_ca_file_is_trusted_after_a_reload_of_the_unchanged_policy(
        start_gateway: StartGateway, tmp_path: Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    _, runner = await _serve_tls_on(0, server_context(old_ca, "127.0.0.1"))
    port = runner.addresses[0][1]
    ca_file = tmp_path / "ca.pem"
    old_ca.cert_pem.write_to_path(str(ca_file))
    policy_path = tmp_path / "policy.yaml"
    policy = single_backend_policy(f"https://127.0.0.1:{port}/v1")
    policy["backends"]["up"]["ca_file"] = str(ca_file)
    policy_path.write_text(yaml.safe_dump(policy))
    gateway = await start_gateway(policy_path.read_text(), Settings(
        port=0, policy_path=policy_path, watch_policy=False, supervise=False))
    assert (await _chat(gateway.url))[0] == 200

    # The backend's certificate and the bundle trusting it are both replaced.
    await runner.cleanup()
    fake, runner = await _serve_tls_on(port, server_context(new_ca, "127.0.0.1"))
    new_ca.cert_pem.write_to_path(str(ca_file))
    stat = os.stat(ca_file)
    os.utime(ca_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    status, body = await _chat(gateway.url)
    assert status == 502 and "failed TLS verification" in body["error"]["message"]

    result = await gateway.app[RELOADER].reload("signal")  # SIGHUP

    assert result.result == "ok" and not result.changed
    status, body = await _chat(gateway.url)
    assert status == 200 and len(fake.received) == 1
    await runner.cleanup()


async def test_an_https_backend_with_an_untrusted_certificate_is_a_502_naming_it(
        ca: trustme.CA, start_tls: StartTls, start_gateway: StartGateway) -> None:
    fake, url = await _tls_openai_backend(ca, start_tls)
    gateway = await start_gateway(single_backend_policy(url))

    status, body = await _chat(gateway.url)

    assert status == 502
    message = body["error"]["message"]
    assert "'up'" in message and "failed TLS verification" in message
    assert fake.received == []


async def test_a_large_body_to_a_tls_backend_that_never_reads_it_ends_at_total_s(
        ca: trustme.CA) -> None:
    done = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head, then not a byte of the body
        await done.wait()
        writer.close()

    server = await asyncio.start_server(stall, "127.0.0.1", 0, limit=64 * 1024,
                                        ssl=server_context(ca, "127.0.0.1"))
    port = server.sockets[0].getsockname()[1]
    client = Http1Client(f"https://127.0.0.1:{port}/v1", max_connections=1,
                         timeouts=Timeouts(connect_s=2.0, first_byte_s=5.0, total_s=0.4),
                         ssl_context=trusting(ca))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(aiohttp.ServerTimeoutError, match="did not read the request body"):
        await client.post("/x", b"x" * (32 << 20))
    assert loop.time() - started < 1.5
    done.set()
    await client.close()
    server.close()
    await server.wait_closed()
