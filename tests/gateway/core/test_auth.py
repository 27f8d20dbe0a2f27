"""API keys → tenants, anonymous access, admin keys."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from gateway.core.auth import require_admin
from gateway.core.errors import Forbidden, Unauthorized
from tests.conftest import StartGateway, as_policy, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def _hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def keyed_policy(url: str, *, anonymous: dict[str, Any] | None = None) -> dict[str, Any]:
    return single_backend_policy(
        url, tenants={"acme": {"api_keys": [_hash("acme-key")]}},
        auth={"anonymous": anonymous or {"enabled": False},
              "admin_keys": [_hash("admin-key")]})


async def _status(url: str, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=BODY, headers=headers) as response:
        return response.status


@pytest.mark.parametrize(("headers", "status"), [
    ({"Authorization": "Bearer acme-key"}, 200),
    ({"Authorization": "bearer acme-key"}, 200),
    ({"x-api-key": "acme-key"}, 200),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": "Basic acme-key"}, 401),
    ({}, 401),
])
async def test_keys_are_checked_by_their_hash(openai_upstream: FakeOpenAI,
                                              start_gateway: StartGateway,
                                              headers: dict[str, str], status: int) -> None:
    gateway = await start_gateway(keyed_policy(openai_upstream.url))
    assert await _status(gateway.url, headers) == status


async def test_the_backend_never_sees_the_clients_key(openai_upstream: FakeOpenAI,
                                                      start_gateway: StartGateway) -> None:
    policy = keyed_policy(openai_upstream.url)
    policy["backends"]["up"]["api_key"] = "backend-secret"
    gateway = await start_gateway(policy)

    await _status(gateway.url, {"Authorization": "Bearer acme-key"})

    assert openai_upstream.received[-1].headers["Authorization"] == "Bearer backend-secret"


async def test_anonymous_access_serves_callers_without_a_key(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed_policy(openai_upstream.url,
                                               anonymous={"enabled": True}))
    assert await _status(gateway.url, {}) == 200


class _Peer:
    """The two things auth reads from a request: headers and the peer address."""

    def __init__(self, remote: str, headers: dict[str, str] | None = None) -> None:
        self.remote = remote
        self.headers = CIMultiDict(headers or {})


def test_loopback_only_anonymous_access_refuses_other_peers() -> None:
    from gateway.core.auth import Authenticator

    policy = as_policy(keyed_policy("http://127.0.0.1:1/v1",
                                    anonymous={"enabled": True, "loopback_only": True}))
    auth = Authenticator()
    assert auth.authenticate(_Peer("::1"), policy).anonymous  # type: ignore[arg-type]
    with pytest.raises(Unauthorized):
        auth.authenticate(_Peer("10.0.0.5"), policy)  # type: ignore[arg-type]


def test_a_tenant_key_resolves_to_its_tenant_and_hash() -> None:
    from gateway.core.auth import Authenticator

    policy = as_policy(keyed_policy("http://127.0.0.1:1/v1"))
    identity = Authenticator().authenticate(
        _Peer("10.0.0.5", {"Authorization": "Bearer acme-key"}), policy)  # type: ignore[arg-type]
    assert identity.tenant == "acme" and identity.key_hash == _hash("acme-key")


def test_require_admin_accepts_only_admin_keys() -> None:
    policy = as_policy(keyed_policy("http://127.0.0.1:1/v1"))

    def request(headers: dict[str, str]) -> web.Request:
        return _Peer("127.0.0.1", headers)  # type: ignore[return-value]

    assert require_admin(request({"Authorization": "Bearer admin-key"}), policy) == _hash(
        "admin-key")
    with pytest.raises(Forbidden):
        require_admin(request({"Authorization": "Bearer acme-key"}), policy)
    with pytest.raises(Unauthorized):
        require_admin(request({}), policy)


async def _call(url: str, headers: dict[str, str], body: dict[str, Any] | None = None
                ) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body or BODY, headers=headers) as response:
        return response.status, response.headers, await response.json()


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "routegate.access"]


@pytest.mark.parametrize("header", ["acme-key", "Basic acme-key", "Token acme-key"])
async def test_a_key_without_the_bearer_scheme_is_told_the_scheme_is_missing(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, header: str) -> None:
    gateway = await start_gateway(keyed_policy(openai_upstream.url))
    status, _, body = await _call(gateway.url, {"Authorization": header})
    assert status == 401
    assert body["error"]["code"] == "invalid_authorization_header"
    assert "Bearer" in body["error"]["message"] and "acme-key" not in body["error"]["message"]


async def test_every_response_names_the_tenant_it_was_served_as(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed_policy(openai_upstream.url, anonymous={"enabled": True}))
    _, headers, _ = await _call(gateway.url, {"Authorization": "Bearer acme-key"})
    assert headers["x-routegate-tenant"] == "acme"
    _, headers, _ = await _call(gateway.url, {})
    assert headers["x-routegate-tenant"] == "anonymous"
    status, headers, _ = await _call(gateway.url, {"Authorization": "Bearer acme-key"},
                                     {"model": "nope", "messages": []})
    assert status in (400, 404) and headers["x-routegate-tenant"] == "acme"
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/models", "/v1/responses/resp_none"):
            async with session.get(gateway.url + path,
                                   headers={"Authorization": "Bearer acme-key"}) as answer:
                assert answer.headers["x-routegate-tenant"] == "acme", path


async def test_an_unknown_key_served_anonymously_is_marked_in_the_access_log(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        caplog: pytest.LogCaptureFixture) -> None:
    gateway = await start_gateway(keyed_policy(openai_upstream.url, anonymous={"enabled": True}))
    with caplog.at_level(logging.INFO, logger="routegate.access"):
        status, headers, _ = await _call(gateway.url, {"Authorization": "Bearer typo-key"})
        await _call(gateway.url, {})
        await _call(gateway.url, {"Authorization": "Bearer acme-key"})
    assert status == 200 and headers["x-routegate-tenant"] == "anonymous"
    assert [line["auth"] for line in _access_lines(caplog)] == ["unknown_key", "anonymous", "key"]
    assert "typo-key" not in caplog.text


async def test_reject_unknown_keys_refuses_a_key_it_does_not_know_but_serves_no_key(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed_policy(
        openai_upstream.url, anonymous={"enabled": True, "reject_unknown_keys": True}))
    status, _, body = await _call(gateway.url, {"Authorization": "Bearer typo-key"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert (await _call(gateway.url, {"Authorization": "typo-key"}))[0] == 401
    assert (await _call(gateway.url, {}))[0] == 200
