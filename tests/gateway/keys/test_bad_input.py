"""Bad input to the admin API: a 400 naming the field, and nothing written."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import StartGateway
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.keys.admin_client import AdminApi, keys_policy


@pytest.mark.parametrize(("body", "field"), [
    ({"tenant": "acme", "colour": "red"}, "colour"),
    ({"tenant": "acme", "budget": {"usd_per_day": -1}}, "budget.usd_per_day"),
    ({"tenant": "acme", "budget": {"usd_total": "lots"}}, "budget.usd_total"),
    ({"tenant": "acme", "limits": {"requests_per_minute": 0}}, "limits.requests_per_minute"),
    ({"tenant": "acme", "expires_at": time.time() - 60}, "expires_at"),
    ({"tenant": "acme", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
    ({"tenant": "globex", "allow": ["embed"]}, "allow[0]"),
    ({"tenant": "acme", "allow_targets": ["elsewhere/*"]}, "allow_targets[0]"),
    ({"tenant": "nobody"}, "tenant"),
    ({}, "tenant"),
    ({"tenant": "acme", "scopes": ["admin:everything"]}, "scopes.0"),
])
async def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, body: dict[str, Any],
        field: str) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    admin = AdminApi(gateway.url)
    status, answer = await admin.call("POST", "/admin/keys", body)
    assert status == 400, answer
    assert answer["error"]["param"] == field, answer
    assert (await admin.call("GET", "/admin/keys"))[1]["data"] == []


async def test_a_body_that_is_not_json_is_a_400(openai_upstream: FakeOpenAI,
                                                start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    import aiohttp
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/admin/keys", data=b"{not json",
            headers={"Authorization": "Bearer admin-key"}) as response:
        assert response.status == 400


@pytest.mark.parametrize("query", ["group_by=colour", "from=yesterday", "format=xml",
                                   "from=2026-01-10&to=2026-01-01"])
async def test_a_bad_spend_query_is_a_400(openai_upstream: FakeOpenAI,
                                          start_gateway: StartGateway, query: str) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    status, answer = await AdminApi(gateway.url).call("GET", f"/admin/spend?{query}")
    assert status == 400 and answer["error"]["param"] in query, answer


async def test_an_unknown_key_id_is_a_404(openai_upstream: FakeOpenAI,
                                          start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    status, answer = await AdminApi(gateway.url).call("POST", "/admin/keys/key_nope/revoke")
    assert status == 404 and answer["error"]["code"] == "key_not_found"


async def test_an_oversized_admin_body_is_a_413(openai_upstream: FakeOpenAI,
                                                start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    status, _ = await AdminApi(gateway.url).call(
        "POST", "/admin/keys", {"tenant": "acme", "name": "x" * 100_000})
    assert status == 413
