"""The limiter as the pipeline sees it: policy in, headers or an OpenAI-shaped 429 out."""

from __future__ import annotations

import itertools

import pytest

from gateway.limits.limiter import (
    BudgetExceeded,
    Limiter,
    RequestsLimitExceeded,
    TokensLimitExceeded,
)
from gateway.limits.memory import MemoryStore
from gateway.limits.store import Charge
from policies.load import Policy, loads
from routing.cost import charged_micros

KEY = "sha256:" + "ab" * 32
POLICY = f"""
version: 1
backends:
  openai:
    type: openai
    url: http://127.0.0.1:9/v1
    models:
      gpt-4o-mini: {{input_usd_per_mtok: 0.15, output_usd_per_mtok: 0.60}}
  local:
    type: openai
    url: http://127.0.0.1:9/v1
    deployment: dedicated
    gpu_hour_usd: 3.6
    models:
      llama: {{}}
routes:
  chat: {{targets: [openai/gpt-4o-mini]}}
  batch: {{targets: [local/llama], limits: {{requests_per_minute: 1}}}}
tenants:
  acme:
    api_keys: ["{KEY}"]
    limits: {{requests_per_minute: 3, tokens_per_minute: 1000}}
    key_limits: {{requests_per_minute: 2}}
    budget: {{usd_per_day: 0.001, usd_per_month: 1}}
defaults:
  limits: {{requests_per_minute: 5, tokens_per_minute: 100}}
"""
T0 = 1_764_400_000.0  # 2025-11-29 07:06:40 UTC


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def policy() -> Policy:
    return loads(POLICY)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(clock: Clock) -> Limiter:
    counter = itertools.count()
    return Limiter(MemoryStore(), clock=clock, new_id=lambda: f"r{next(counter)}")


async def test_an_admitted_request_gets_openais_rate_limit_headers(limiter, policy) -> None:
    ticket = await limiter.admit(policy, "acme", tokens=100)
    # Capacity returns when one more than remains would fit: the request counts in full
    # for its window's minute, then its weight in the next one rounds to 0 half-way
    # through (and 100 tokens weigh 99.5 after 0.3 s of it); the headers say at most
    # the window.
    assert ticket.headers == {
        "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-reset-requests": "1m0s",
        "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "1m0s",
    }


async def test_a_request_over_the_rpm_is_a_429_shaped_like_openais(limiter, policy,
                                                                   clock) -> None:
    for _ in range(3):
        await limiter.admit(policy, "acme", tokens=1)
        clock.now += 10
    with pytest.raises(RequestsLimitExceeded) as caught:
        await limiter.admit(policy, "acme", tokens=1)
    error = caught.value
    assert error.status == 429
    # the window ends in 30 s; in the next one its 3 weigh 2.5 a sixth of the way in
    assert error.body()["error"] == {
        "message": "Rate limit reached for acme on requests per min (RPM): Limit 3, Used 3, "
                   "Requested 1. Please try again in 40s.",
        "type": "requests", "code": "rate_limit_exceeded", "param": None,
    }
    assert error.headers["Retry-After"] == "40"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"


async def test_remaining_and_reset_follow_the_window_as_the_clock_moves(limiter, policy,
                                                                      clock) -> None:
    for _ in range(3):
        await limiter.admit(policy, "acme", tokens=1)
    clock.now += 70  # a sixth into the next window: the three weigh 2.5, counted as 2
    ticket = await limiter.admit(policy, "acme", tokens=1)
    assert ticket.headers["x-ratelimit-remaining-requests"] == "0"
    # one more fits once they weigh 1.5 — half-way through this window
    assert ticket.headers["x-ratelimit-reset-requests"] == "20s"


async def test_a_request_over_the_tpm_names_tokens(limiter, policy) -> None:
    await limiter.admit(policy, "acme", tokens=900)
    with pytest.raises(TokensLimitExceeded) as caught:
        await limiter.admit(policy, "acme", tokens=200)
    assert caught.value.body()["error"]["type"] == "tokens"
    assert caught.value.body()["error"]["code"] == "rate_limit_exceeded"


async def test_a_request_that_can_never_fit_tells_the_sdk_not_to_retry(limiter, policy) -> None:
    with pytest.raises(TokensLimitExceeded) as caught:
        await limiter.admit(policy, "acme", tokens=5000)
    assert caught.value.headers["x-should-retry"] == "false"
    assert "Request too large" in caught.value.message


async def test_per_key_limits_apply_inside_the_tenant(limiter, policy) -> None:
    await limiter.admit(policy, "acme", tokens=1, key_hash=KEY)
    await limiter.admit(policy, "acme", tokens=1, key_hash=KEY)
    with pytest.raises(RequestsLimitExceeded) as caught:
        await limiter.admit(policy, "acme", tokens=1, key_hash=KEY)
    assert "acme (key:abab" in caught.value.message
    await limiter.admit(policy, "acme", tokens=1)  # the tenant itself still has room


async def test_tenants_without_limits_get_the_defaults(limiter, policy) -> None:
    ticket = await limiter.admit(policy, "anonymous", tokens=10)
    assert ticket.headers["x-ratelimit-limit-requests"] == "5"
    assert ticket.headers["x-ratelimit-limit-tokens"] == "100"


async def test_settling_a_cancelled_stream_charges_what_it_produced(limiter, policy) -> None:
    ticket = await limiter.admit(policy, "acme", tokens=900)
    await limiter.settle(ticket, actual_tokens=10)
    again = await limiter.admit(policy, "acme", tokens=900)
    assert again.headers["x-ratelimit-remaining-tokens"] == str(1000 - 10 - 900)


async def test_settling_twice_charges_once(limiter, policy) -> None:
    ticket = await limiter.admit(policy, "acme", tokens=10)
    await limiter.settle(ticket, actual_tokens=10, charge=Charge(5, 5, 100))
    await limiter.settle(ticket, actual_tokens=10, charge=Charge(5, 5, 100))
    usage = await limiter.usage(policy, "acme")
    assert usage["day"]["requests"] == 1 and usage["day"]["spend_micros"] == 100


async def test_remaining_budget_is_the_tighter_of_day_and_month(limiter, policy) -> None:
    ticket = await limiter.admit(policy, "acme", tokens=10)
    assert ticket.remaining_budget_micros == 1000  # $0.001 a day
    await limiter.settle(ticket, actual_tokens=10, charge=Charge(5, 5, 400))
    assert (await limiter.admit(policy, "acme", tokens=1)).remaining_budget_micros == 600


async def test_a_spent_budget_is_a_429_naming_the_budget_and_its_reset(limiter, policy) -> None:
    ticket = await limiter.admit(policy, "acme", tokens=10)
    await limiter.settle(ticket, actual_tokens=10, charge=Charge(5, 5, 1000))
    with pytest.raises(BudgetExceeded) as caught:
        await limiter.admit(policy, "acme", tokens=1)
    error = caught.value
    assert error.status == 429 and error.code == "budget_exceeded"
    assert error.message == (
        "Budget exceeded for tenant acme: the daily budget of $0.001 is spent ($0.001). "
        "It resets at 2025-11-30T00:00:00Z (in 16h53m20s).")
    assert error.headers["Retry-After"] == str(16 * 3600 + 53 * 60 + 20)


async def test_usage_reports_requests_tokens_and_spend_per_period(limiter, policy) -> None:
    ticket = await limiter.admit(policy, "acme", tokens=10)
    await limiter.settle(ticket, actual_tokens=30, charge=Charge(10, 20, 250))
    usage = await limiter.usage(policy, "acme")
    assert usage["day"] == {
        "period": "2025-11-29", "requests": 1, "input_tokens": 10, "output_tokens": 20,
        "total_tokens": 30, "spend_micros": 250, "spend_usd": 0.00025, "budget_micros": 1000,
        "remaining_micros": 750, "resets_at": "2025-11-30T00:00:00Z",
    }
    assert usage["month"]["period"] == "2025-11" and usage["month"]["budget_micros"] == 1_000_000


def test_shared_backends_cost_their_per_token_prices(policy) -> None:
    target = policy.targets["openai/gpt-4o-mini"]
    # 1000 × $0.15/M + 500 × $0.60/M = $0.00045 = 450 µ$
    assert charged_micros(target.backend, target.spec, 1000, 500) == 450


def test_dedicated_backends_charge_the_amortised_price_routing_decided_with(policy) -> None:
    target = policy.targets["local/llama"]
    assert charged_micros(target.backend, target.spec, 600, 400,
                          amortised_usd_per_mtok=2.5) == 2500
    # no decision (nothing amortised): its declared per-token prices, none here
    assert charged_micros(target.backend, target.spec, 600, 400) == 0


async def test_per_route_limits_apply_inside_the_tenant(limiter, policy) -> None:
    await limiter.admit(policy, "acme", tokens=10, route="batch")
    with pytest.raises(RequestsLimitExceeded):
        await limiter.admit(policy, "acme", tokens=10, route="batch")
    await limiter.admit(policy, "acme", tokens=10, route="chat")  # other routes unaffected
