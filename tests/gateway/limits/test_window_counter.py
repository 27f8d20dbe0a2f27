"""The sliding-window counter's promises, on every store (memory, Redis, a Redis
Cluster), with time passed in: how a burst is bounded, when capacity returns, and how
settlement reconciles a reservation. (The shared behaviour is in test_store_behaviour.)"""

from __future__ import annotations

import itertools
import math

from gateway.limits.store import WINDOW_S, BudgetLimits, Charge, LimitStore, Scope

T0 = 1_764_400_000.0  # 2025-11-29 07:06:40 UTC, mid-day so no period boundary nearby
ids = (f"w{n}" for n in itertools.count())


async def offer(store: LimitStore, scopes: tuple[Scope, ...], at: float,
                tokens: int = 1) -> bool:
    decision = await store.admit("acme", scopes, tokens, BudgetLimits(), at, next(ids))
    return decision.admitted


async def test_a_fresh_scope_admits_exactly_its_limit_however_the_burst_spreads(store):
    scopes = (Scope("tenant", 100, None),)
    # 300 requests over 59 s: a token bucket would also admit what refilled meanwhile
    admitted = [await offer(store, scopes, T0 + n * 59 / 300) for n in range(300)]
    assert sum(admitted) == 100 and all(admitted[:100])


async def test_after_a_full_window_its_slots_return_one_by_one_through_the_next(store):
    scopes = (Scope("tenant", 10, None),)
    assert all([await offer(store, scopes, T0) for _ in range(10)])
    slot_s = WINDOW_S / 10
    for k in range(1, 11):  # the k-th opens (k − ½) slots into the next window
        opens = T0 + WINDOW_S + (k - 0.5) * slot_s
        assert not await offer(store, scopes, opens - 0.01)
        assert await offer(store, scopes, opens)


async def test_steady_demand_above_the_limit_gets_the_limit_every_window(store):
    scopes = (Scope("tenant", 6, None),)
    per_window = [0] * 4
    for n in range(4 * 120):  # a request every 0.5 s for four minutes: 20 a minute
        if await offer(store, scopes, T0 + n * 0.5):
            per_window[n // 120] += 1
    assert per_window == [6, 6, 6, 6]


async def test_no_interval_admits_more_than_a_token_bucket_of_the_limit_would(store):
    limit = 10
    scopes = (Scope("tenant", limit, None),)
    # The worst case: the window's limit all at its end (one at its start began it),
    # then demand all through the next window and on.
    times = [T0] if await offer(store, scopes, T0) else []
    for n in range(20):
        at = T0 + WINDOW_S - 0.1 + n * 0.001
        if await offer(store, scopes, at):
            times.append(at)
    for n in range(1, 4 * 120):
        at = T0 + WINDOW_S + n * 0.25
        if await offer(store, scopes, at):
            times.append(at)
    assert len(times) == 3 * limit  # each of the three windows got its limit
    for tau in (0.001, 1.0, 6.0, 15.0, 30.0, WINDOW_S - 0.001):
        bound = limit + math.floor(limit * tau / WINDOW_S + 0.5)
        worst = max(sum(1 for t in times if start <= t < start + tau) for start in times)
        assert worst <= bound, (tau, worst, bound)
    # the minute that straddles the two windows comes close to twice the limit
    straddling = sum(1 for t in times if T0 + WINDOW_S - 0.1 <= t < T0 + 2 * WINDOW_S - 0.1)
    assert limit < straddling <= 2 * limit


async def test_a_refund_settled_in_the_next_window_comes_off_the_window_that_counted_it(
        store):
    scopes = (Scope("tenant", None, 1000),)
    decision = await store.admit("acme", scopes, 600, BudgetLimits(), T0, "estimate")
    await store.settle(decision.reservation, 100, Charge(), T0 + WINDOW_S)
    # at the next window's start its predecessor weighs in full: 100, not 600
    assert await offer(store, scopes, T0 + WINDOW_S, tokens=900)


async def test_a_refund_settled_after_its_window_stopped_weighing_changes_nothing(store):
    scopes = (Scope("tenant", None, 1000),)
    first = await store.admit("acme", scopes, 600, BudgetLimits(), T0, "first")
    assert await offer(store, scopes, T0 + 70, tokens=300)  # the next window
    await store.settle(first.reservation, 0, Charge(), T0 + 130)  # two windows on
    after = await store.admit("acme", scopes, 0, BudgetLimits(), T0 + 130, "after")
    # the 300 weigh 5/6 ten seconds into the window after theirs; nothing was taken off
    assert after.states[0].tokens == 250


async def test_usage_beyond_the_estimate_counts_against_the_next_request(store):
    scopes = (Scope("tenant", None, 1000),)
    decision = await store.admit("acme", scopes, 100, BudgetLimits(), T0, "short")
    await store.settle(decision.reservation, 800, Charge(), T0 + 1)
    assert not await offer(store, scopes, T0 + 2, tokens=300)
    assert await offer(store, scopes, T0 + 2, tokens=200)
