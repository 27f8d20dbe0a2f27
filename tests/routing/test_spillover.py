"""Spillover with a fake clock: local capacity first, shared API when local would miss
the TTFT budget, back to local when the load drops. Cost is reported against
sending everything to the shared API and everything to the local GPU.

Run with `-s` to see the figures.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from policies.load import loads
from routing.decide import Candidate, Router
from routing.features import RequestFeatures
from routing.stats import LiveStats

POLICY = loads("""
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:9/v1
    deployment: dedicated
    region: eu-west-1
    gpu_hour_usd: 0.4
    max_concurrency: 4
    models:
      llama: {priors: {network_ms: 5, prefill_tokens_per_s: 4000, decode_tokens_per_s: 50}}
  openai:
    type: openai
    url: http://127.0.0.1:9/v1
    deployment: shared
    models:
      gpt-4o-mini:
        input_usd_per_mtok: 0.15
        output_usd_per_mtok: 0.60
        priors: {network_ms: 300, decode_tokens_per_s: 100}
routes:
  chat:
    targets: [local/llama, openai/gpt-4o-mini]
    objective: cheapest
    latency_budget: {ttft_ms: 800}
""")
LOCAL, SHARED = "local/llama", "openai/gpt-4o-mini"
INPUT_TOKENS, OUTPUT_TOKENS = 200, 100
TTFT_BUDGET_S = 0.8
# Arrivals per second over three 20-second phases: the local box (4 streams,
# 2 s per request: 2 requests/s) copes with 1/s, not with 5/s.
PHASES = [(0.0, 20.0, 1.0), (20.0, 40.0, 5.0), (40.0, 60.0, 1.0)]
REQUEST = RequestFeatures(
    route="chat", tenant="t", tenant_tags=frozenset(), priority="normal",
    input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, output_tokens_source="request",
    stream=True, pii=frozenset(), ttft_budget_ms=TTFT_BUDGET_S * 1000, total_budget_ms=None)


class SimulatedGpu:
    """A FIFO server with `slots` parallel streams: what the local backend really does."""

    def __init__(self, slots: int, network_s: float, prefill_s: float, decode_s: float) -> None:
        self.free_at = [0.0] * slots
        self.network_s, self.prefill_s, self.decode_s = network_s, prefill_s, decode_s

    def serve(self, now: float) -> tuple[float, float]:
        """(ttft, end) in seconds for a request arriving at `now`."""
        slot = min(range(len(self.free_at)), key=self.free_at.__getitem__)
        start = max(now, self.free_at[slot])
        first = start + self.network_s + self.prefill_s
        self.free_at[slot] = first + self.decode_s
        return first - now, first + self.decode_s


@dataclass
class Outcome:
    routes: list[tuple[float, str]] = field(default_factory=list)  # (arrival, target)
    cost_micro_usd: int = 0
    budget_misses: int = 0

    def share_local(self, start: float, end: float) -> float:
        picked = [key for at, key in self.routes if start <= at < end]
        return sum(key == LOCAL for key in picked) / len(picked)


def arrivals() -> list[float]:
    times: list[float] = []
    for start, end, rate in PHASES:
        step = 1.0 / rate
        times.extend(start + i * step for i in range(round((end - start) * rate)))
    return times


def run(choose: Callable[[Router, LiveStats, float], Candidate]) -> Outcome:
    router, stats = Router(POLICY), LiveStats()
    gpu = SimulatedGpu(4, 0.005, INPUT_TOKENS / 4000, OUTPUT_TOKENS / 50)
    finishing: list[tuple[float, int, str, float, float, float]] = []  # a fake clock's timers
    outcome = Outcome()
    for n, now in enumerate(arrivals()):
        while finishing and finishing[0][0] <= now:
            end, _, key, ttft_s, explained_ms, predicted_ms = heapq.heappop(finishing)
            stats.request_finished(key)
            stats.record_success(key, network_ms=5.0 if key == LOCAL else 300.0,
                                 ttft_ms=ttft_s * 1000, total_ms=None,
                                 output_tokens=OUTPUT_TOKENS, explained_ttft_ms=explained_ms,
                                 predicted_ttft_ms=predicted_ms)
        chosen = choose(router, stats, now)
        if chosen.key == LOCAL:
            ttft_s, end = gpu.serve(now)
        else:
            ttft_s, end = 0.3, now + 0.3 + OUTPUT_TOKENS / 100
        stats.request_started(chosen.key)
        heapq.heappush(finishing, (end, n, chosen.key, ttft_s, chosen.explained_ttft_ms,
                                   chosen.ttft_ms))
        outcome.routes.append((now, chosen.key))
        outcome.cost_micro_usd += chosen.cost_micro_usd
        outcome.budget_misses += ttft_s > TTFT_BUDGET_S
    return outcome


def routed(router: Router, stats: LiveStats, now: float) -> Candidate:
    primary = router.decide(REQUEST, stats.snapshot(), now).primary
    assert primary is not None
    return primary


def always(key: str) -> Callable[[Router, LiveStats, float], Candidate]:
    unbudgeted = replace(REQUEST, ttft_budget_ms=None)

    def choose(router: Router, stats: LiveStats, now: float) -> Candidate:
        decision = router.decide(unbudgeted, stats.snapshot(), now)
        return next(c for c in decision.candidates if c.key == key)

    return choose


def test_traffic_spills_to_the_shared_api_under_load_and_comes_back() -> None:
    by_policy = run(routed)
    always_local = run(always(LOCAL))
    always_shared = run(always(SHARED))

    print(f"\nspillover scenario, {len(by_policy.routes)} requests, TTFT budget 800 ms:")
    for name, outcome in (("routed", by_policy), ("always local", always_local),
                          ("always shared", always_shared)):
        print(f"  {name:<14} cost {outcome.cost_micro_usd:>6} µUSD   "
              f"TTFT budget misses {outcome.budget_misses:>3}")

    assert by_policy.share_local(0, 20) == 1.0  # quiet: all on the local GPU
    assert by_policy.share_local(20, 40) < 0.6  # busy: the overflow goes to the shared API
    assert by_policy.share_local(25, 40) > 0.2  # ... while the local GPU stays in use
    assert by_policy.share_local(45, 60) == 1.0  # quiet again: back to local
    assert by_policy.cost_micro_usd < always_shared.cost_micro_usd
    assert by_policy.budget_misses < always_local.budget_misses / 4
