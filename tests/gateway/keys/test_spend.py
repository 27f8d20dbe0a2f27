"""`GET /admin/spend`: the cost every request settled with, per day and by the
dimensions asked for, from one replica or several."""

from __future__ import annotations

import asyncio
import csv
import io

from tests.conftest import StartGateway
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.keys.admin_client import POLICY_KEY, AdminApi, chat, keys_policy
from tests.redis_server import RedisServer


async def test_spend_by_tenant_and_key_adds_up_to_the_costs_charged(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    admin = AdminApi(gateway.url)
    created = await admin.create()
    for key in (created["key"], created["key"], POLICY_KEY):
        assert (await chat(gateway.url, key))[0] == 200
    status, report = await admin.call("GET", "/admin/spend?group_by=tenant,key,route,backend")
    assert status == 200
    rows = {row["key"]: row for row in report["data"]}
    assert rows[created["id"]]["requests"] == 2 and rows[created["id"]]["route"] == "chat"
    assert rows[created["id"]]["backend"] == "up"
    assert next(key for key in rows if key.startswith("policy:"))
    status, shown = await admin.call("GET", f"/admin/keys/{created['id']}")
    # the same micro-dollars as the budgets: the key's day in the limit store
    assert rows[created["id"]]["cost_micros"] == shown["spend"]["day_micros"] > 0
    assert shown["spend"]["total_micros"] == shown["spend"]["day_micros"]
    status, by_tenant = await admin.call("GET", "/admin/spend")
    assert [row["tenant"] for row in by_tenant["data"]] == ["acme"]
    assert by_tenant["data"][0]["requests"] == 3


async def test_spend_as_csv(openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    assert (await chat(gateway.url, POLICY_KEY))[0] == 200
    status, text = await AdminApi(gateway.url).call("GET",
                                                    "/admin/spend?group_by=model&format=csv")
    assert status == 200
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(row["model"], row["requests"]) for row in rows] == [("chat", "1")]
    assert int(rows[0]["cost_micros"]) > 0


async def test_spend_outside_the_dates_asked_for_is_left_out(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    assert (await chat(gateway.url, POLICY_KEY))[0] == 200
    status, report = await AdminApi(gateway.url).call(
        "GET", "/admin/spend?from=2020-01-01&to=2020-01-31")
    assert status == 200 and report["data"] == []


async def test_spend_of_both_replicas_is_in_one_report(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    policy = keys_policy(openai_upstream.url, store=redis_server.url)
    one, two = await start_gateway(policy), await start_gateway(policy)
    for gateway in (one, two, two):
        assert (await chat(gateway.url, POLICY_KEY))[0] == 200
    await asyncio.sleep(1.2)  # the other replica writes its spend once a second
    status, report = await AdminApi(one.url).call("GET", "/admin/spend")
    assert status == 200 and report["data"][0]["requests"] == 3
