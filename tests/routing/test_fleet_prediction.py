"""A fleet target's predicted TTFT leaves out the prefill its best replica has cached,
so a route spills to a shared API exactly when no replica can make the budget."""

from __future__ import annotations

from dataclasses import replace

from routing.decide import Router
from routing.stats import StatsSnapshot
from tests.routing.policies import policy
from tests.routing.test_decide import REQUEST, keys, reasons

ROUTER = Router(policy())
LONG = replace(REQUEST, input_tokens=8000, ttft_budget_ms=1900.0)  # 2 s prefill at 4000 tok/s


def ttft_of(decision: object, key: str) -> float:
    return next(c.ttft_ms for c in decision.candidates if c.key == key)  # type: ignore[attr-defined]


def test_a_cold_long_prompt_spills_to_a_shared_api() -> None:
    decision = ROUTER.decide(LONG, StatsSnapshot(), 0.0)
    assert reasons(decision).get("local/llama") == "latency_budget"
    assert keys(decision)[0] == "openai/gpt-4o-mini"


def test_a_prompt_a_replica_holds_fits_the_budget_there() -> None:
    held = replace(LONG, cached_share={"local/llama": 0.9})
    decision = ROUTER.decide(held, StatsSnapshot(), 0.0)
    assert keys(decision)[0] == "local/llama"
    cold = ROUTER.decide(replace(LONG, ttft_budget_ms=None), StatsSnapshot(), 0.0)
    assert ttft_of(decision, "local/llama") < 0.2 * ttft_of(cold, "local/llama")
