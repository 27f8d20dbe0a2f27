"""One behavioural suite, run against every store (memory and a real Redis)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from gateway.limits.store import WINDOW_S, BudgetLimits, Charge, LimitStore, Scope
from gateway.limits.window_counter import requests_reset_s, tokens_reset_s

T0 = 1_764_400_000.0  # 2025-11-29 07:06:40 UTC, mid-day so no period boundary nearby
NO_BUDGET = BudgetLimits()
ids = (f"r{n}" for n in itertools.count())


def rpm(limit: int) -> tuple[Scope, ...]:
    return (Scope("tenant", limit, None),)


def tpm(limit: int) -> tuple[Scope, ...]:
    return (Scope("tenant", None, limit),)


async def admit(store: LimitStore, scopes: tuple[Scope, ...], now: float, tokens: int = 1,
                tenant: str = "acme", budget: BudgetLimits = NO_BUDGET):
    return await store.admit(tenant, scopes, tokens, budget, now, next(ids))


async def test_admits_up_to_the_request_limit_then_rejects_naming_requests(store):
    decisions = [await admit(store, rpm(3), T0 + i) for i in range(4)]
    assert [d.admitted for d in decisions] == [True, True, True, False]
    rejection = decisions[3].rejection
    assert rejection.kind == "requests" and rejection.limit == 3 and rejection.used == 3


async def test_exactly_the_limit_is_admitted_out_of_three_times_as_many_concurrent(store):
    decisions = await asyncio.gather(*(admit(store, rpm(100), T0) for _ in range(300)))
    assert sum(d.admitted for d in decisions) == 100


async def test_a_full_window_frees_a_slot_once_its_weight_in_the_next_has_fallen(store):
    await admit(store, rpm(2), T0)  # the scope's window: T0 to T0 + 60
    await admit(store, rpm(2), T0 + 10)
    rejected = await admit(store, rpm(2), T0 + 30)
    # in the next window the two weigh 2 × (1 − e / 60 s), rounded: one more fits once
    # that is 1.5, a quarter of the way in
    assert rejected.rejection.retry_after_s == pytest.approx(WINDOW_S - 30 + WINDOW_S / 4)
    assert not (await admit(store, rpm(2), T0 + 74.99)).admitted
    assert (await admit(store, rpm(2), T0 + 75.01)).admitted


async def test_tokens_are_reserved_and_the_limit_names_tokens(store):
    assert (await admit(store, tpm(1000), T0, tokens=600)).admitted
    rejected = await admit(store, tpm(1000), T0 + 5, tokens=500)
    assert rejected.rejection.kind == "tokens"
    assert rejected.rejection.used == 600 and rejected.rejection.requested == 500
    # the 600 fit again with 500 more once their weight in the next window is 500.5
    assert rejected.rejection.retry_after_s == pytest.approx(55 + WINDOW_S * (1 - 500.5 / 600))
    assert (await admit(store, tpm(1000), T0 + 5, tokens=400)).admitted


async def test_a_request_larger_than_the_token_limit_never_fits(store):
    rejected = await admit(store, tpm(1000), T0, tokens=1001)
    assert rejected.rejection.kind == "tokens" and rejected.rejection.retry_after_s is None


async def test_exactly_the_token_limit_is_admitted_out_of_concurrent_requests(store):
    decisions = await asyncio.gather(*(admit(store, tpm(10_000), T0, tokens=100)
                                       for _ in range(300)))
    assert sum(d.admitted for d in decisions) == 100


async def test_a_rejection_in_one_scope_reserves_nothing_in_the_others(store):
    scopes = (Scope("tenant", 10, None), Scope("key:abc", 1, None))
    assert (await admit(store, scopes, T0)).admitted
    rejected = await admit(store, scopes, T0 + 1)
    assert rejected.rejection.scope.key == "key:abc"
    tenant_state = rejected.states[0]
    assert tenant_state.requests == 1  # the rejected request left no entry


async def test_settling_refunds_the_unused_part_of_the_estimate(store):
    decision = await admit(store, tpm(1000), T0, tokens=900)
    await store.settle(decision.reservation, 10, Charge(), T0 + 1)
    after = await admit(store, tpm(1000), T0 + 2, tokens=900)
    assert after.admitted and after.states[0].tokens == 910


async def test_a_request_no_backend_answered_leaves_the_request_window(store):
    scopes = (Scope("tenant", 2, 1000),)
    for _ in range(2):
        decision = await admit(store, scopes, T0, tokens=400)
        await store.settle(decision.reservation, 0, Charge(refund_request=True), T0 + 1)
    after = await admit(store, scopes, T0 + 2, tokens=400)
    assert after.admitted and after.states[0].requests == 1 and after.states[0].tokens == 400


async def test_a_refund_settled_in_the_next_window_comes_off_the_one_that_counted_it(store):
    scopes = (Scope("tenant", 1, None),)
    decision = await admit(store, scopes, T0)
    await store.settle(decision.reservation, 1, Charge(refund_request=True), T0 + WINDOW_S + 1)
    assert (await admit(store, scopes, T0 + WINDOW_S + 2)).admitted


async def test_settling_charges_usage_beyond_the_estimate(store):
    decision = await admit(store, tpm(1000), T0, tokens=100)
    await store.settle(decision.reservation, 700, Charge(), T0 + 1)
    rejected = await admit(store, tpm(1000), T0 + 2, tokens=400)
    assert rejected.rejection.used == 700


async def test_extra_usage_settled_after_the_window_is_charged_when_it_arrives(store):
    # settled two windows on: nothing of the estimate weighs any more
    decision = await admit(store, tpm(1000), T0, tokens=100)
    await store.settle(decision.reservation, 600, Charge(), T0 + 150)
    rejected = await admit(store, tpm(1000), T0 + 151, tokens=600)
    assert rejected.rejection.used == 500


async def test_extra_usage_settled_in_the_next_window_is_charged_to_it_in_full(store):
    decision = await admit(store, tpm(1000), T0, tokens=100)
    await store.settle(decision.reservation, 600, Charge(), T0 + 90)
    state = (await admit(store, tpm(1000), T0 + 90, tokens=0)).states[0]
    # the extra 500 count in full; the estimate's window, half-way down, weighs 50
    assert state.tokens == 500 + 50


async def test_extra_usage_settled_after_the_window_uses_no_request_slot(store):
    # A long stream that outlived its window and used more than its estimate: its
    # tokens are charged late, but it was one request, already counted once.
    scopes = (Scope("tenant", 1, 10_000),)
    decision = await admit(store, scopes, T0, tokens=100)
    # two windows on, when the request itself no longer weighs
    await store.settle(decision.reservation, 600, Charge(), T0 + 150)
    after = await admit(store, scopes, T0 + 151, tokens=100)
    assert after.admitted
    assert (after.states[0].requests, after.states[0].tokens) == (1, 600)


async def test_a_settled_correction_weighs_with_the_window_that_counted_it(store):
    first = await admit(store, tpm(1000), T0, tokens=100)
    await store.settle(first.reservation, 700, Charge(), T0 + 1)
    assert (await admit(store, tpm(1000), T0 + 10, tokens=200)).admitted
    rejected = await admit(store, tpm(1000), T0 + 20, tokens=500)
    assert rejected.rejection.used == 900
    # 500 more fit once the window's 900 weigh 500.5 in the next one
    assert rejected.rejection.retry_after_s == pytest.approx(40 + WINDOW_S * (1 - 500.5 / 900),
                                                             abs=0.001)
    # in the next window's last millisecond the 900 (estimates and correction) weigh 0
    after = await admit(store, tpm(1000), T0 + 2 * WINDOW_S - 0.001, tokens=500)
    assert after.admitted and after.states[0].tokens == 500


async def test_tenants_have_separate_windows(store):
    assert (await admit(store, rpm(1), T0, tenant="acme")).admitted
    assert (await admit(store, rpm(1), T0, tenant="globex")).admitted
    assert not (await admit(store, rpm(1), T0, tenant="acme")).admitted


async def test_states_report_usage_and_when_capacity_next_returns(store):
    await admit(store, (Scope("tenant", 10, 1000),), T0, tokens=100)
    decision = await admit(store, (Scope("tenant", 10, 1000),), T0 + 5, tokens=50)
    state = decision.states[0]
    assert (state.requests, state.tokens) == (2, 150)
    # 55 s until the window ends; then the two requests weigh 1.5 a quarter of the way
    # into the next, and the 150 tokens 149.5 after 1/300 of it
    assert requests_reset_s(state) == pytest.approx(55 + WINDOW_S / 4)
    assert tokens_reset_s(state) == pytest.approx(55 + WINDOW_S / 300)


async def test_the_ledger_counts_requests_tokens_and_spend_per_day_and_month(store):
    for cost in (1500, 2500):
        decision = await admit(store, rpm(10), T0)
        await store.settle(decision.reservation, 30, Charge(10, 20, cost), T0 + 1)
    usage = await store.usage("acme", T0 + 2)
    assert (usage.day.requests, usage.day.input_tokens, usage.day.output_tokens) == (2, 20, 40)
    assert usage.day.spend_micros == usage.month.spend_micros == 4000
    assert usage.day.period == "2025-11-29" and usage.month.period == "2025-11"


async def test_a_new_day_starts_a_new_daily_total_but_not_a_new_month(store):
    decision = await admit(store, rpm(10), T0)
    await store.settle(decision.reservation, 1, Charge(1, 0, 700), T0)
    usage = await store.usage("acme", T0 + 86_400)
    assert usage.day.spend_micros == 0 and usage.month.spend_micros == 700


async def test_a_spent_daily_budget_rejects_naming_the_day(store):
    budget = BudgetLimits(day_micros=1000, month_micros=100_000)
    decision = await admit(store, rpm(10), T0, budget=budget)
    assert decision.admitted
    await store.settle(decision.reservation, 1, Charge(1, 0, 1000), T0)
    rejected = await admit(store, rpm(10), T0 + 1, budget=budget)
    assert rejected.rejection.kind == "budget_day"
    assert rejected.rejection.used == 1000 and rejected.rejection.limit == 1000


async def test_a_spent_monthly_budget_rejects_even_on_a_new_day(store):
    budget = BudgetLimits(month_micros=1000)
    decision = await admit(store, rpm(10), T0, budget=budget)
    await store.settle(decision.reservation, 1, Charge(1, 0, 1200), T0)
    rejected = await admit(store, rpm(10), T0 + 86_400, budget=budget)
    assert rejected.rejection.kind == "budget_month"


async def test_an_admission_reports_what_was_spent_so_far(store):
    decision = await admit(store, rpm(10), T0)
    await store.settle(decision.reservation, 1, Charge(1, 0, 250), T0)
    after = await admit(store, rpm(10), T0 + 1)
    assert (after.spent_day_micros, after.spent_month_micros) == (250, 250)
