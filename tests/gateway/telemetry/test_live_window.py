"""The live dashboard's window: bounded, and no work for the garbage collector."""

from __future__ import annotations

import gc

from gateway.telemetry.live import LiveWindow, Sample


def sample(at_s: float, n: int) -> Sample:
    return Sample(at_s=at_s, backend="local", route="chat", status=200, total_ms=10.0 + n,
                  queue_ms=0.5, ttft_ms=None, inference_ms=8.0, reason="cheapest",
                  cost_usd=0.0)


def test_a_full_window_leaves_nothing_for_the_collector() -> None:
    """Samples live for minutes; as objects they would fill the young generation, whose
    collections pause the event loop."""
    live = LiveWindow(max_samples=20_000, clock=lambda: 1000.0)
    live.record(sample(999.0, 0))
    live.rejected("shed")
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for n in range(10_000):
            live.record(sample(999.0, n))
            live.rejected("rate_limit")
        grown = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert grown < 50
    assert live.snapshot()["requests"] == 10_001


def test_the_window_keeps_the_newest_samples_within_its_bounds() -> None:
    now = [1000.0]
    live = LiveWindow(window_s=60.0, max_samples=3, clock=lambda: now[0])
    for n in range(5):
        live.record(sample(990.0 + n, n))
    assert live.snapshot()["requests"] == 3  # the count bound
    now[0] = 1052.5  # the window starts at 992.5: the sample at 992 leaves
    summary = live.snapshot()
    assert summary["requests"] == 2
    assert summary["backends"]["local"]["e2e_ms"] == {"p50": 13.0, "p95": 14.0}
