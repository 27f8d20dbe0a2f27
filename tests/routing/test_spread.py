"""Load spreading: equals within a tolerance, drawn by weight, the less busy one leads."""

from __future__ import annotations

from dataclasses import replace

from policies.load import Policy, loads
from routing.decide import Router
from routing.features import RequestFeatures
from routing.spread import pick
from routing.stats import LiveStats, StatsSnapshot

REQUEST = RequestFeatures(
    route="chat", tenant="t", tenant_tags=frozenset(), priority="normal",
    input_tokens=1000, output_tokens=100, output_tokens_source="request", stream=False,
    pii=frozenset(), ttft_budget_ms=None, total_budget_ms=None)


def policy(prices: tuple[float, float, float], *, within: str = "5%",
           weights: str = "{}") -> Policy:
    backends = "\n".join(
        f"  {name}: {{type: openai, url: 'http://127.0.0.1:{8001 + i}/v1', "
        f"models: {{m: {{input_usd_per_mtok: {price}, output_usd_per_mtok: {price}}}}}}}"
        for i, (name, price) in enumerate(zip("abc", prices, strict=True)))
    return loads(f"""
version: 1
backends:
{backends}
routes:
  chat:
    targets: [a/m, b/m, c/m]
    spread: {{within: {within}}}
    weights: {weights}
""")


def lead(policy: Policy, draws: tuple[float, float], stats: StatsSnapshot | None = None,
         ) -> str:
    decision = Router(policy).decide(REQUEST, stats or StatsSnapshot(), 0.0, draws=draws)
    assert decision.primary is not None
    return decision.primary.key


def test_candidates_within_the_tolerance_share_the_lead() -> None:
    equal = policy((1.00, 1.04, 2.0))
    assert {lead(equal, (draw, 0.5)) for draw in (0.1, 0.4, 0.6, 0.9)} == {"a/m", "b/m"}


def test_a_candidate_past_the_tolerance_never_leads() -> None:
    apart = policy((1.00, 1.10, 1.20))
    assert {lead(apart, (draw, draw)) for draw in (0.1, 0.5, 0.9)} == {"a/m"}
    assert Router(apart).decide(REQUEST, StatsSnapshot(), 0.0).spread is None


def test_of_the_two_drawn_the_less_busy_leads() -> None:
    stats = LiveStats()
    for _ in range(3):
        stats.request_started("a/m")
    equal = policy((1.0, 1.0, 1.0))
    # draws 0.1 and 0.1: a first, then the first of the rest, b
    assert lead(equal, (0.1, 0.1)) == "a/m"
    assert lead(equal, (0.1, 0.1), stats.snapshot()) == "b/m"


def test_the_decision_is_a_function_of_its_inputs() -> None:
    equal = policy((1.0, 1.0, 1.0))
    assert [lead(equal, (0.7, 0.3)) for _ in range(5)] == [lead(equal, (0.7, 0.3))] * 5


def test_weights_set_the_share_among_equals() -> None:
    weighted = policy((1.0, 1.0, 9.0), weights="{a/m: 3}")
    grid = [i / 100 for i in range(100)]
    leads = [lead(weighted, (draw, 0.5)) for draw in grid]
    assert leads.count("a/m") == 75 and leads.count("b/m") == 25


def test_the_decision_explains_its_spread() -> None:
    decision = Router(policy((1.0, 1.02, 5.0))).decide(REQUEST, StatsSnapshot(), 0.0,
                                                       draws=(0.9, 0.0))
    spread = decision.to_dict()["spread"]
    assert spread["within_percent"] == 5.0 and spread["chosen"] == "b/m"
    assert [e["target"] for e in spread["equals"]] == ["a/m", "b/m"]
    assert spread["drawn"] == ["b/m", "a/m"]
    assert [c.key for c in decision.candidates] == ["b/m", "a/m", "c/m"]


def test_pick_draws_two_distinct_by_weight() -> None:
    drawn, chosen = pick(["x", "y"], [1.0, 1.0], [0, 0], (0.99, 0.99))
    assert drawn == (1, 0) and chosen == 1


def test_a_budget_miss_spreads_over_the_fastest_equals() -> None:
    stats = LiveStats()
    decision = Router(policy((1.0, 1.0, 1.0))).decide(
        replace(REQUEST, ttft_budget_ms=0.001), stats.snapshot(), 0.0, draws=(0.5, 0.5))
    assert decision.budget_missed and decision.spread is not None
