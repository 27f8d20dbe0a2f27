"""Two gateway replicas sharing one real Redis: a key made on one works on the other, a
revocation is seen by the other within a second, a budget holds across both, and while
Redis is down managed keys are refused (`fail_closed`) or served as last known."""

from __future__ import annotations

import asyncio
import time

import redis as sync_redis

from gateway.core.drain import DRAIN
from gateway.keys.admin import SERVICE
from gateway.keys.record import KeyRecord
from tests.conftest import RunningGateway, StartGateway
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.keys.admin_client import POLICY_KEY, AdminApi, chat, keys_policy
from tests.redis_server import RedisServer
from tests.waiting import until


async def _replicas(start_gateway: StartGateway, upstream: FakeOpenAI, redis: RedisServer,
                    **keys: object) -> tuple[RunningGateway, RunningGateway]:
    policy = keys_policy(upstream.url, store=redis.url, **keys)
    return await start_gateway(policy), await start_gateway(policy)


async def _until_known(gateway: RunningGateway, key_id: str) -> None:
    """Until `gateway`'s view of the key store has the key (made on another replica)."""
    async def known() -> bool:
        return key_id in gateway.app[SERVICE].view.records

    await until(known, 2.0)


async def test_a_revocation_on_one_replica_is_seen_by_the_other_within_a_second(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    one, two = await _replicas(start_gateway, openai_upstream, redis_server)
    created = await AdminApi(one.url).create()

    async def works_on_two() -> bool:
        return (await chat(two.url, created["key"]))[0] == 200

    await until(works_on_two, 1.0)
    status, _ = await AdminApi(one.url).call("POST", f"/admin/keys/{created['id']}/revoke")
    assert status == 200

    async def refused_on_two() -> bool:
        return (await chat(two.url, created["key"]))[0] == 401

    assert await until(refused_on_two, 1.0) < 1.0


async def test_a_revocation_is_seen_without_notifications_by_the_periodic_check(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    one, two = await _replicas(start_gateway, openai_upstream, redis_server)
    created = await AdminApi(one.url).create()
    # a replica that missed the notification (a dropped subscription) still catches up
    client = sync_redis.Redis.from_url(redis_server.url)
    assert client.pubsub_numsub("rg:keys:changed")[0][1] == 2
    raw = client.hget("{rg:keys}:records", created["id"])
    assert raw is not None
    revoked = KeyRecord.from_json(raw).updated(time.time(), revoked_at=time.time())
    with client.pipeline() as pipe:  # a write as the script makes it, minus the notification
        seq = client.incr("{rg:keys}:seq")
        pipe.hset("{rg:keys}:records", created["id"], revoked.to_json())
        pipe.zadd("{rg:keys}:changes", {created["id"]: seq})
        pipe.execute()

    async def refused_on_both() -> bool:
        return ((await chat(one.url, created["key"]))[0] == 401
                and (await chat(two.url, created["key"]))[0] == 401)

    assert await until(refused_on_both, 1.0) < 1.0


async def test_a_keys_daily_budget_holds_across_replicas(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    one, two = await _replicas(start_gateway, openai_upstream, redis_server)
    created = await AdminApi(one.url).create(budget={"usd_per_day": 0.001})
    await _until_known(two, created["id"])
    assert (await chat(one.url, created["key"]))[0] == 200  # spends it all
    await one.app[DRAIN].wait_idle()  # charged once its last byte was written
    for gateway in (one, two):
        status, answer = await chat(gateway.url, created["key"])
        assert status == 429 and answer["error"]["code"] == "budget_exceeded", answer


async def test_a_keys_rpm_is_one_limit_across_replicas(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    one, two = await _replicas(start_gateway, openai_upstream, redis_server)
    created = await AdminApi(one.url).create(limits={"requests_per_minute": 10})
    await _until_known(two, created["id"])
    answers = await asyncio.gather(*(chat((one, two)[n % 2].url, created["key"])
                                     for n in range(30)))
    assert sorted(status for status, _ in answers).count(200) == 10


async def test_with_redis_down_managed_keys_fail_closed_and_policy_keys_work(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    policy = keys_policy(openai_upstream.url, max_stale_s=0.5)
    policy["keys"]["store"] = redis_server.url  # limits stay in memory: only keys are out
    gateway = await start_gateway(policy)
    created = await AdminApi(gateway.url).create()
    assert (await chat(gateway.url, created["key"]))[0] == 200
    # unresponsive (not restarted empty: a restart without persistence loses the keys)
    sync_redis.Redis.from_url(redis_server.url).client_pause(2500)
    await asyncio.sleep(1.2)
    status, answer = await chat(gateway.url, created["key"])
    assert status == 503 and answer["error"]["code"] == "key_store_unavailable"
    assert (await chat(gateway.url, POLICY_KEY))[0] == 200

    async def works_again() -> bool:
        return (await chat(gateway.url, created["key"]))[0] == 200

    await until(works_again, 3.0)


async def test_with_redis_down_fail_open_serves_keys_as_last_known(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    policy = keys_policy(openai_upstream.url, max_stale_s=0.5, on_store_error="fail_open")
    policy["keys"]["store"] = redis_server.url
    gateway = await start_gateway(policy)
    created = await AdminApi(gateway.url).create()
    redis_server.kill()
    await asyncio.sleep(1.0)
    assert (await chat(gateway.url, created["key"]))[0] == 200
    status, answer = await AdminApi(gateway.url).call("POST", "/admin/keys", {"tenant": "acme"})
    assert status == 503, answer  # nothing half-written: no key, and it says so
