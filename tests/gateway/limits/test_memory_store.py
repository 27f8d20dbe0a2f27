"""The in-process store's log costs the garbage collector nothing, however busy."""

from __future__ import annotations

import gc

from gateway.limits.memory import MemoryStore
from gateway.limits.store import BudgetLimits, Charge, Scope

T0 = 1_764_400_000.0
SCOPES = (Scope("tenant", 1_000_000, 100_000_000), Scope("key:abc", 1_000_000, None))


def tracked_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


async def test_a_minute_of_admitted_requests_adds_no_object_the_collector_walks() -> None:
    store = MemoryStore()
    decision = store.admit_now("acme", SCOPES, 10, BudgetLimits(), T0, "warm-up")
    await store.settle(decision.reservation, 12, Charge(), T0)
    before = tracked_objects()
    for n in range(5_000):  # all inside one window: every entry is still held
        decision = store.admit_now("acme", SCOPES, 10, BudgetLimits(), T0 + n / 1000, f"r{n}")
        assert decision.admitted
        await store.settle(decision.reservation, 7 + n % 5, Charge(), T0 + n / 1000)
    del decision
    # 10,000 entries and their token corrections are held; the full collections that
    # a busy gateway runs must not walk them one by one
    assert tracked_objects() - before < 50
