"""The admin API on the embedded store: a key is created, used, limited, rotated and
revoked without touching the policy, and bad input is a 400 naming the field."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson

from gateway.keys.admin import SERVICE
from gateway.settings import Settings
from tests.conftest import StartGateway
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.keys.admin_client import POLICY_KEY, AdminApi, chat, keys_policy, sha
from tests.waiting import until


async def test_a_created_key_works_at_once_and_only_its_hash_is_stored(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, tmp_path: Path) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url),
                                  Settings(port=0, data_dir=tmp_path))
    admin = AdminApi(gateway.url)
    created = await admin.create(name="billing app", labels=["team-a"])
    assert created["key"].startswith("rg-") and created["status"] == "active"
    status, answer = await chat(gateway.url, created["key"])
    assert status == 200, answer
    stored = b"".join(path.read_bytes()
                      for path in tmp_path.glob("keys.sqlite3*"))  # noqa: ASYNC240
    assert created["key"].encode() not in stored
    assert sha(created["key"]).encode() in stored  # what is kept: the hash
    status, shown = await admin.call("GET", f"/admin/keys/{created['id']}")
    assert status == 200 and "key" not in shown and "key_hash" not in orjson.dumps(shown).decode()


async def test_a_revoked_key_is_refused_and_policy_keys_keep_working(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    admin = AdminApi(gateway.url)
    created = await admin.create()
    status, _ = await admin.call("POST", f"/admin/keys/{created['id']}/revoke")
    assert status == 200
    status, answer = await chat(gateway.url, created["key"])
    assert status == 401, answer
    assert (await chat(gateway.url, POLICY_KEY))[0] == 200


async def test_rotation_keeps_the_old_key_for_the_grace_period_only(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    admin = AdminApi(gateway.url)
    created = await admin.create()
    status, rotated = await admin.call("POST", f"/admin/keys/{created['id']}/rotate",
                                       {"grace_s": 0.5})
    assert status == 200 and rotated["key"] != created["key"]
    assert (await chat(gateway.url, rotated["key"]))[0] == 200
    assert (await chat(gateway.url, created["key"]))[0] == 200  # within the grace period
    await asyncio.sleep(0.6)
    assert (await chat(gateway.url, created["key"]))[0] == 401
    assert (await chat(gateway.url, rotated["key"]))[0] == 200


async def test_an_expired_key_is_refused(openai_upstream: FakeOpenAI,
                                         start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    admin = AdminApi(gateway.url)
    created = await admin.create(expires_at=time.time() + 0.3)
    assert (await chat(gateway.url, created["key"]))[0] == 200
    await asyncio.sleep(0.4)
    assert (await chat(gateway.url, created["key"]))[0] == 401
    status, shown = await admin.call("GET", f"/admin/keys/{created['id']}")
    assert status == 200 and shown["status"] == "expired"


async def test_a_key_may_use_only_its_routes(openai_upstream: FakeOpenAI,
                                             start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    created = await AdminApi(gateway.url).create(allow=["embed"])
    status, answer = await chat(gateway.url, created["key"])
    assert status == 404 and answer["error"]["code"] == "model_not_found"


async def test_a_key_over_its_rpm_gets_429_naming_the_key(openai_upstream: FakeOpenAI,
                                                           start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    created = await AdminApi(gateway.url).create(limits={"requests_per_minute": 2})
    statuses = [(await chat(gateway.url, created["key"]))[0] for _ in range(3)]
    assert statuses == [200, 200, 429]
    status, answer = await chat(gateway.url, created["key"])
    assert status == 429 and created["id"] in answer["error"]["message"]
    assert (await chat(gateway.url, POLICY_KEY))[0] == 200  # the tenant's other keys are not


async def test_a_key_over_its_daily_budget_gets_budget_exceeded(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    admin = AdminApi(gateway.url)
    # a request costs (prompt + completion tokens) × $0.01: far over $0.001
    created = await admin.create(budget={"usd_per_day": 0.001})
    assert (await chat(gateway.url, created["key"]))[0] == 200
    status, answer = await chat(gateway.url, created["key"])
    assert status == 429 and answer["error"]["code"] == "budget_exceeded"
    assert "daily budget" in answer["error"]["message"]
    status, shown = await admin.call("GET", f"/admin/keys/{created['id']}")
    assert shown["spend"]["day_micros"] > 1000 and shown["remaining"]["day_micros"] == 0


async def test_a_key_over_its_total_budget_gets_budget_exceeded(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    created = await AdminApi(gateway.url).create(budget={"usd_total": 0.001})
    assert (await chat(gateway.url, created["key"]))[0] == 200
    status, answer = await chat(gateway.url, created["key"])
    assert status == 429 and "total budget" in answer["error"]["message"]


async def test_an_update_changes_a_keys_limits_at_once(openai_upstream: FakeOpenAI,
                                                       start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    admin = AdminApi(gateway.url)
    created = await admin.create()
    status, updated = await admin.call("PATCH", f"/admin/keys/{created['id']}",
                                       {"limits": {"requests_per_minute": 1}, "name": "x"})
    assert status == 200 and updated["limits"]["requests_per_minute"] == 1
    assert updated["name"] == "x"
    assert [(await chat(gateway.url, created["key"]))[0] for _ in range(2)] == [200, 429]


async def test_listing_pages_and_filters_by_tenant_and_label(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    admin = AdminApi(gateway.url)
    made = [await admin.create(labels=["a"] if n % 2 else ["b"]) for n in range(5)]
    await admin.create(tenant="globex")
    status, page = await admin.call("GET", "/admin/keys?tenant=acme&limit=2")
    assert status == 200 and [k["id"] for k in page["data"]] == [k["id"] for k in made[:2]]
    assert page["has_more"]
    status, rest = await admin.call("GET", f"/admin/keys?tenant=acme&after={page['next_after']}")
    assert [k["id"] for k in rest["data"]] == [k["id"] for k in made[2:]]
    status, labelled = await admin.call("GET", "/admin/keys?label=a")
    assert [k["id"] for k in labelled["data"]] == [made[1]["id"], made[3]["id"]]


async def test_workers_sharing_the_embedded_store_see_a_revocation_within_a_second(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, tmp_path: Path) -> None:
    # two apps on one data directory: what the workers of `serve --workers 2` share
    settings = Settings(port=0, data_dir=tmp_path)
    one = await start_gateway(keys_policy(openai_upstream.url), settings)
    two = await start_gateway(keys_policy(openai_upstream.url), settings)
    created = await AdminApi(one.url).create()
    await until(lambda: created["id"] in two.app[SERVICE].view.records)  # its next check
    assert (await chat(two.url, created["key"]))[0] == 200
    assert (await AdminApi(one.url).call("POST", f"/admin/keys/{created['id']}/revoke"))[0] \
        == 200
    started = time.monotonic()
    while (await chat(two.url, created["key"]))[0] != 401:
        assert time.monotonic() - started < 1.0
        await asyncio.sleep(0.02)
