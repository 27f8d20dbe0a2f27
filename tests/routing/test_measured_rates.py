"""A launched backend's own measured rates (its warm-up, reported on its model card)
replace the policy's priors in the latency prediction, from the first request on."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.capabilities import RATE_RANGE, from_report, resolve
from routing.predict import TargetModel, predict
from routing.stats import LiveStats
from tests.routing.policies import policy

POLICY = policy()
TARGET = POLICY.targets["local/llama"]  # priors: 2 ms network, 4000 tok/s prefill, 50 tok/s


def reported(prefill: Any, decode: Any) -> TargetModel:
    card = {"id": "llama", "capabilities": {}, "prefill_tokens_per_s": prefill,
            "decode_tokens_per_s": decode}
    report = from_report(card)
    return TargetModel.of(TARGET, resolve(TARGET.backend, TARGET.spec, report))


def test_the_first_prediction_uses_the_measured_rates() -> None:
    model = reported(200.0, 5.0)
    stats = LiveStats()
    first = predict(model, 400, 10, stats.snapshot().target(model.key), 0.0)
    assert first.ttft_ms == 2 + 2000  # network + 400 tokens at 200 tok/s, not 100 ms
    assert first.total_ms == first.ttft_ms + 2000  # 10 tokens at 5 tok/s
    # a request in each of the 4 slots already: the next waits about one service time
    for _ in range(4):
        stats.request_started(model.key)
    queued = predict(model, 400, 10, stats.snapshot().target(model.key), 0.0)
    assert queued.queue_ms == (2000 + 2000) / 4


@settings(max_examples=200, deadline=None)
@given(prefill=st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.integers(),
                         st.floats(allow_nan=True, allow_infinity=True)),
       decode=st.one_of(st.none(), st.integers(), st.floats(allow_nan=True,
                                                             allow_infinity=True)))
def test_any_reported_value_gives_a_finite_positive_rate(prefill: Any, decode: Any) -> None:
    """A card's odd values (missing, zero, negative, tiny, huge, infinite, NaN, a string,
    a bool) fall back to the priors, never to a rate that breaks the arithmetic (a
    near-zero decode rate made the cost infinite, and its rounding raised)."""
    model = reported(prefill, decode)
    p = predict(model, 100, 10, LiveStats().snapshot().target(model.key), 0.0)
    assert math.isfinite(p.ttft_ms) and p.ttft_ms > 0
    assert math.isfinite(p.total_ms) and p.total_ms >= p.ttft_ms
    usable = isinstance(prefill, int | float) and not isinstance(prefill, bool) \
        and RATE_RANGE[0] <= prefill <= RATE_RANGE[1]
    assert model.prefill_ms_per_token == (1000.0 / prefill if usable else 1000.0 / 4000)
