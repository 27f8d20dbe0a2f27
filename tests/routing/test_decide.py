"""decide(): filters with named reasons, prediction, budget, objective, rejections."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.load import loads
from routing.decide import RouteDecision, Router, decide
from routing.features import RequestFeatures
from routing.stats import LiveStats, StatsSnapshot
from tests.routing.policies import BASE, policy

POLICY = policy()
ROUTER = Router(POLICY)
EMPTY = StatsSnapshot()
REQUEST = RequestFeatures(
    route="chat", tenant="globex", tenant_tags=frozenset(), priority="normal",
    input_tokens=200, output_tokens=100, output_tokens_source="request", stream=False,
    pii=frozenset(), ttft_budget_ms=800.0, total_budget_ms=20_000.0)


def keys(decision: RouteDecision) -> list[str]:
    return [c.key for c in decision.candidates]


def reasons(decision: RouteDecision) -> dict[str, str]:
    return {e.key: e.reason for e in decision.excluded}


def test_cheapest_puts_the_idle_dedicated_backend_first_then_shared_by_price() -> None:
    decision = ROUTER.decide(REQUEST, EMPTY, 0.0)
    assert keys(decision) == ["local/llama", "openai/gpt-4o-mini", "anthropic/haiku"]
    assert decision.primary is not None and decision.primary.within_budget
    assert decision.rejection is None and decision.excluded == ()


def test_fastest_orders_by_predicted_total() -> None:
    decision = Router(policy(objective="fastest")).decide(REQUEST, EMPTY, 0.0)
    totals = [c.total_ms for c in decision.candidates]
    assert totals == sorted(totals) and keys(decision)[0] == "openai/gpt-4o-mini"


def test_region_rule_excludes_backends_outside_the_tenants_region() -> None:
    decision = ROUTER.decide(replace(REQUEST, tenant="acme", tenant_tags=frozenset({"eu"})),
                             EMPTY, 0.0)
    assert keys(decision) == ["local/llama"]
    assert reasons(decision) == {"openai/gpt-4o-mini": "region", "anthropic/haiku": "region"}


def test_a_missing_fact_fails_closed_and_says_so() -> None:
    decision = ROUTER.decide(replace(REQUEST, tenant="bank"), EMPTY, 0.0)
    assert reasons(decision) == {"anthropic/haiku": "data_retention"}
    assert "not declared" in decision.excluded[0].detail


def test_pii_under_local_only_keeps_only_dedicated_backends() -> None:
    decision = ROUTER.decide(replace(REQUEST, pii=frozenset({"email"})), EMPTY, 0.0)
    assert keys(decision) == ["local/llama"]
    assert set(reasons(decision).values()) == {"pii"}


def test_pii_under_redact_routes_anywhere_and_asks_for_redaction() -> None:
    decision = Router(policy(pii_action="redact")).decide(
        replace(REQUEST, pii=frozenset({"email"})), EMPTY, 0.0)
    assert len(decision.candidates) == 3 and decision.redact == {"email"}


def test_pii_under_block_is_a_403_naming_the_category() -> None:
    decision = Router(policy(pii_action="block")).decide(
        replace(REQUEST, pii=frozenset({"us_ssn"})), EMPTY, 0.0)
    assert decision.rejection is not None
    assert (decision.rejection.status, decision.rejection.code) == (403, "pii_blocked")
    assert "us_ssn" in decision.rejection.message and decision.candidates == ()


def test_context_window_too_small_is_excluded() -> None:
    decision = ROUTER.decide(replace(REQUEST, input_tokens=9000), EMPTY, 0.0)
    assert reasons(decision) == {"local/llama": "context_window"}


def test_unhealthy_backend_is_excluded() -> None:
    stats = LiveStats()
    stats.mark_unhealthy("local/llama", until=10.0)
    decision = ROUTER.decide(REQUEST, stats.snapshot(), 5.0)
    assert reasons(decision) == {"local/llama": "backend_unhealthy"}


def test_tenant_budget_excludes_what_it_cannot_pay_for() -> None:
    decision = ROUTER.decide(replace(REQUEST, tenant_budget_left_micro_usd=100), EMPTY, 0.0)
    # 200 in + 100 out: gpt-4o-mini 90 µUSD fits, haiku 700 µUSD does not.
    assert reasons(decision) == {"anthropic/haiku": "tenant_budget_exhausted"}


def test_a_budget_with_something_left_still_runs_a_request_nothing_covers_in_full() -> None:
    # Budgets are post-paid: the limiter refuses once one is spent, not before.
    decision = ROUTER.decide(replace(REQUEST, tenant_budget_left_micro_usd=1), EMPTY, 0.0)
    assert len(decision.candidates) == 3 and decision.excluded == ()


def test_a_spent_budget_is_a_429() -> None:
    decision = ROUTER.decide(replace(REQUEST, tenant_budget_left_micro_usd=0), EMPTY, 0.0)
    assert decision.rejection is not None
    assert (decision.rejection.status, decision.rejection.code) == (429, "budget_exceeded")


def test_a_busy_dedicated_backend_over_budget_is_excluded_for_latency() -> None:
    stats = LiveStats()
    for _ in range(8):  # 4 slots, 8 in flight: 5 requests ahead
        stats.request_started("local/llama")
    decision = ROUTER.decide(REQUEST, stats.snapshot(), 0.0)
    assert reasons(decision) == {"local/llama": "latency_budget"}
    assert "TTFT" in decision.excluded[0].detail


def test_when_nothing_fits_on_budget_miss_fastest_picks_the_fastest_anyway() -> None:
    decision = ROUTER.decide(replace(REQUEST, ttft_budget_ms=1.0), EMPTY, 0.0)
    assert decision.budget_missed and decision.rejection is None
    assert keys(decision)[0] == "openai/gpt-4o-mini"  # fastest total, not cheapest
    assert not any(c.within_budget for c in decision.candidates)


def test_when_nothing_fits_on_budget_miss_reject_is_a_503_naming_why() -> None:
    decision = Router(policy(on_miss="reject")).decide(
        replace(REQUEST, ttft_budget_ms=1.0), EMPTY, 0.0)
    assert decision.rejection is not None
    assert (decision.rejection.status, decision.rejection.code) == \
        (503, "latency_budget_unmeetable")
    assert "local/llama" in decision.rejection.message and decision.candidates == ()


def test_when_policy_forbids_every_target_it_is_a_403() -> None:
    decision = ROUTER.decide(replace(REQUEST, tenant="acme", tenant_tags=frozenset({"eu"}),
                                     pii=frozenset({"email"}), input_tokens=9000), EMPTY, 0.0)
    # the one target the policy allows cannot hold the prompt: the request's to change
    assert decision.rejection is not None
    assert (decision.rejection.status, decision.rejection.code) == \
        (400, "context_length_exceeded")
    decision = ROUTER.decide(replace(REQUEST, route="openai/gpt-4o-mini", tenant="acme",
                                     tenant_tags=frozenset({"eu"})), EMPTY, 0.0)
    assert decision.rejection is not None
    assert (decision.rejection.status, decision.rejection.code) == (403, "policy_forbids")


def test_a_target_named_directly_is_the_only_candidate() -> None:
    decision = ROUTER.decide(replace(REQUEST, route="anthropic/haiku"), EMPTY, 0.0)
    assert keys(decision) == ["anthropic/haiku"]


def test_to_dict_explains_candidates_and_exclusions() -> None:
    explained = ROUTER.decide(replace(REQUEST, tenant="bank"), EMPTY, 0.0, "d1").to_dict()
    assert explained["decision_id"] == "d1" and explained["outcome"] == "routed"
    assert explained["candidates"][0]["role"] == "primary"
    assert explained["candidates"][1]["role"] == "fallback"
    assert {"target", "predicted_ttft_ms", "predicted_total_ms", "cost_micro_usd",
            "within_budget"} <= explained["candidates"][0].keys()
    assert explained["excluded"][0]["reason"] == "data_retention"


def test_decision_ids_are_unique_and_the_one_off_form_agrees_with_the_router() -> None:
    a, b = ROUTER.decide(REQUEST, EMPTY, 0.0), decide(REQUEST, POLICY, EMPTY, 0.0)
    assert a.decision_id != b.decision_id and a.candidates == b.candidates


REVERSED = BASE.replace("targets: [local/llama, openai/gpt-4o-mini, anthropic/haiku]",
                        "targets: [anthropic/haiku, openai/gpt-4o-mini, local/llama]")


def ordered_router() -> Router:
    return Router(loads(REVERSED.replace("{pii_action}", "local_only")
                        .replace("{on_miss}", "reject").replace("{objective}", "ordered")))


def test_ordered_leads_with_the_first_target_in_the_routes_order_that_fits() -> None:
    router = ordered_router()
    assert keys(router.decide(REQUEST, EMPTY, 0.0)) == [
        "anthropic/haiku", "openai/gpt-4o-mini", "local/llama"]
    # haiku's predicted 160 ms TTFT misses a 150 ms budget: the next in order leads
    decision = router.decide(replace(REQUEST, ttft_budget_ms=150.0), EMPTY, 0.0)
    assert keys(decision) == ["openai/gpt-4o-mini", "local/llama"]
    assert decision.objective == "ordered"


@settings(max_examples=60, deadline=None)
@given(ttft_budget_ms=st.floats(1.0, 2000.0), budget_left=st.one_of(
    st.none(), st.integers(0, 2000)))
def test_ordered_candidates_keep_the_routes_order_whatever_fits(
        ttft_budget_ms: float, budget_left: int | None) -> None:
    declared = ["anthropic/haiku", "openai/gpt-4o-mini", "local/llama"]
    decision = ORDERED.decide(replace(REQUEST, ttft_budget_ms=ttft_budget_ms,
                                      tenant_budget_left_micro_usd=budget_left), EMPTY, 0.0)
    chosen = keys(decision)
    assert chosen == [key for key in declared if key in chosen]


ORDERED = ordered_router()
