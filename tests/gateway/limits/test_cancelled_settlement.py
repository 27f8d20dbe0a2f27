"""A settlement whose request is cancelled while it runs (a client gone, a shutdown)
still reaches the Redis ledger, once."""

from __future__ import annotations

import asyncio
import itertools
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.limits.failover import FailoverStore
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import BudgetLimits, Charge, Scope
from gateway.stores.redis import connect
from tests.redis_server import RedisServer

SCOPES = (Scope("tenant", 10**6, None),)
COST = Charge(input_tokens=3, output_tokens=2, cost_micros=7)
tenants = itertools.count()


async def settle_and_cancel(url: str, settlements: int, cancel_after: list[int]) -> int:
    """Admit `settlements` requests, settle them all at once over two connections (most
    wait for one), cancel the i-th after `cancel_after[i]` turns of the loop (one at
    least: it has begun); returns
    the requests the Redis ledger counted once everything is done."""
    tenant = f"t{next(tenants)}"
    store = FailoverStore(RedisStore(connect(url, max_connections=2)), probe_interval_s=0.05)
    decisions = [await store.admit(tenant, SCOPES, 5, BudgetLimits(), time.time(), f"r{i}")
                 for i in range(settlements)]
    tasks = []
    for decision in decisions:
        assert decision.reservation is not None
        tasks.append(asyncio.ensure_future(
            store.settle(decision.reservation, 5, COST, time.time())))
    for turn in range(max(cancel_after, default=0) + 1):
        for task, at in zip(tasks, cancel_after, strict=False):
            if at == turn:
                task.cancel()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks, return_exceptions=True)
    await store.aclose()  # lets what is under way finish
    counted = RedisStore(connect(url))
    usage = await counted.usage(tenant, time.time())
    await counted.aclose()
    assert usage.day.spend_micros == usage.day.requests * COST.cost_micros
    return usage.day.requests


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), settlements=st.integers(1, 12))
def test_a_settlement_cancelled_midway_is_counted_once(
        redis_server: RedisServer, data: st.DataObject, settlements: int) -> None:
    cancel_after = data.draw(st.lists(st.integers(1, 6), max_size=settlements))
    counted = asyncio.run(settle_and_cancel(redis_server.url, settlements, cancel_after))
    assert counted == settlements
