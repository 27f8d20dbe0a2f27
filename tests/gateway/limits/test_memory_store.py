"""The in-process store costs the garbage collector nothing, however busy."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.limits.memory import MemoryStore
from gateway.limits.store import BudgetLimits, Charge, Scope

T0 = 1_764_400_000.0
SCOPES = (Scope("tenant", 1_000_000, 100_000_000), Scope("key:abc", 1_000_000, None))


@contextmanager
def young_generation_growth() -> Iterator[list[int]]:
    """How many more tracked objects are alive at the end: each one is work for the
    young generation's collection, and a collection pauses the event loop."""
    gc.collect()
    gc.disable()
    grown = [0]
    try:
        before = gc.get_count()[0]
        yield grown
        grown[0] = gc.get_count()[0] - before
    finally:
        gc.enable()


async def test_a_minute_of_admitted_requests_leaves_nothing_for_the_collector() -> None:
    store = MemoryStore()
    decision = store.admit_now("acme", SCOPES, 10, BudgetLimits(), T0, "warm-up")
    await store.settle(decision.reservation, 12, Charge(), T0)
    with young_generation_growth() as grown:
        for n in range(5_000):  # all inside one window
            decision = store.admit_now("acme", SCOPES, 10, BudgetLimits(), T0 + n / 1000,
                                       f"r{n}")
            assert decision.admitted
            await store.settle(decision.reservation, 7 + n % 5, Charge(), T0 + n / 1000)
        del decision
    # each scope's window is five integers: nothing per request stays behind
    assert grown[0] < 50
