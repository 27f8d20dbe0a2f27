"""The limit store on a real 3-master Redis Cluster (a master killed mid-load), and
behind Redis Sentinel."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from gateway.limits.failover import FailoverStore
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import BudgetLimits, Charge, Scope, StoreUnavailable
from gateway.stores.redis import connect
from tests.ports import free_port
from tests.redis_cluster import RedisClusterNodes
from tests.redis_server import RedisServer

SCOPES = (Scope("tenant", 10**6, None), Scope("key:abc", 10**6, None))
COST = Charge(input_tokens=3, output_tokens=2, cost_micros=7)


def over_cluster(cluster: RedisClusterNodes, on_error: str) -> FailoverStore:
    return FailoverStore(RedisStore(connect(cluster.url, socket_timeout_s=0.5)),
                         on_error=on_error,  # type: ignore[arg-type]
                         probe_interval_s=0.1)


async def test_every_tenants_keys_share_one_slot_so_admission_is_one_script(
        shared_redis_cluster: RedisClusterNodes) -> None:
    store = RedisStore(connect(shared_redis_cluster.url))
    tenants = [f"tenant-{n}" for n in range(12)]  # spread over the three masters
    for tenant in tenants:
        decision = await store.admit(tenant, SCOPES, 5, BudgetLimits(day_micros=100),
                                     time.time(), f"{tenant}-r")
        assert decision.reservation is not None
        await store.settle(decision.reservation, 5, COST, time.time())
        assert (await store.usage(tenant, time.time())).day.spend_micros == 7
    await store.aclose()
    masters = {shared_redis_cluster.master_port_of(f"rg:{{{t}}}:x") for t in tenants}
    assert len(masters) == 3


async def test_every_key_of_a_tenant_windows_ledger_and_receipts_is_in_its_slot(
        shared_redis_cluster: RedisClusterNodes) -> None:
    shared_redis_cluster.flush()
    store = RedisStore(connect(shared_redis_cluster.url))
    scopes = (Scope("tenant", 100, 10_000), Scope("key:abc", 50, None),
              Scope("route:chat", 10, 1000))
    tenants = [f"tenant-{n}" for n in range(6)]
    for tenant in tenants:
        settled = await store.admit(tenant, scopes, 5, BudgetLimits(), time.time(), "a")
        released = await store.admit(tenant, scopes, 5, BudgetLimits(), time.time(), "b")
        assert settled.reservation is not None and released.reservation is not None
        await store.settle(settled.reservation, 9, COST, time.time())
        await store.release(released.reservation, time.time())
    await store.aclose()
    slots: dict[str, set[int]] = {tenant: set() for tenant in tenants}
    kinds: dict[str, set[str]] = {tenant: set() for tenant in tenants}
    for node in shared_redis_cluster.nodes[:3]:
        client = redis.Redis(port=node.port)
        for key in client.keys("rg:*"):
            tenant = key.decode().split("{", 1)[1].split("}", 1)[0]
            slots[tenant].add(int(client.execute_command("CLUSTER KEYSLOT", key)))
            kinds[tenant].add(key.decode().split("}:", 1)[1].split(":", 1)[0])
    assert all(len(found) == 1 for found in slots.values())
    assert all(found == {"w", "spend", "receipts"} for found in kinds.values())


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["fail_open", "fail_closed"])
async def test_a_master_killed_mid_load_fails_as_configured_and_counts_nothing_twice(
        redis_cluster: RedisClusterNodes, on_error: str) -> None:
    store = over_cluster(redis_cluster, on_error)
    settled: list[str] = []  # settlements made (in Redis, or replayed into it later)
    # The load ends between batches, never by cancelling one: a settlement cut short by a
    # cancellation still reaches Redis (as it must), but would be missing from `settled`.
    stop = asyncio.Event()
    outcomes: dict[str, int] = {"redis": 0, "fallback": 0, "refused": 0}

    async def one(request_id: str) -> None:
        now = time.time()
        try:
            decision = await store.admit("acme", SCOPES, 5, BudgetLimits(), now, request_id)
        except StoreUnavailable:
            outcomes["refused"] += 1
            return
        assert decision.reservation is not None
        outcomes[decision.reservation.store] += 1
        await store.settle(decision.reservation, 5, COST, time.time())
        settled.append(request_id)

    async def load(prefix: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline and not stop.is_set():
            await asyncio.gather(*(one(f"{prefix}-{n}-{i}") for i in range(8)))
            n += 1
            await asyncio.sleep(0.01)

    await load("before", 0.5)
    before = len(settled)
    old_port = redis_cluster.master_port_of("rg:{acme}:x")
    redis_cluster.kill_master_of("rg:{acme}:x")
    loading = asyncio.create_task(load("during", 60))
    await asyncio.to_thread(redis_cluster.wait_failover, "rg:{acme}:x", old_port)
    deadline = time.monotonic() + 20
    while not store.healthy or store.outages == 0:  # the outage seen, and over
        assert time.monotonic() < deadline, "the store never went back to the cluster"
        await asyncio.sleep(0.05)
    stop.set()
    await loading
    stop.clear()
    await load("after", 0.5)
    after = await store.usage("acme", time.time())
    await store.aclose()

    assert before > 0 and store.outages >= 1
    if on_error == "fail_closed":
        assert outcomes["refused"] > 0 and outcomes["fallback"] == 0
    else:
        assert outcomes["fallback"] > 0 and outcomes["refused"] == 0
    # Writes the dead master acknowledged but had not yet passed to its replica are
    # lost with it (Redis replicates asynchronously); what reached the ledger was
    # counted once: never more requests or spend than were settled.
    assert 0 < after.day.requests <= len(settled)
    assert after.day.spend_micros == after.day.requests * COST.cost_micros
    assert outcomes["redis"] > before  # admissions went back to the cluster


async def test_the_store_finds_its_master_through_sentinel(
        redis_server: RedisServer, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                      f"sentinel monitor routegate 127.0.0.1 {redis_server.port} 1\n")
    sentinel = await asyncio.create_subprocess_exec(
        redis_server.binary, str(config), "--sentinel",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        store = RedisStore(connect(f"redis+sentinel://127.0.0.1:{port}/routegate"))
        for _ in range(100):  # the sentinel answers once it has looked at the master
            try:
                decision = await store.admit("acme", SCOPES, 5, BudgetLimits(), time.time(),
                                             "via-sentinel")
                break
            except StoreUnavailable:
                await asyncio.sleep(0.05)
        assert decision.reservation is not None
        await store.settle(decision.reservation, 5, COST, time.time())
        assert (await store.usage("acme", time.time())).day.requests == 1
        await store.aclose()
    finally:
        sentinel.terminate()
        await asyncio.wait_for(sentinel.wait(), 10)
