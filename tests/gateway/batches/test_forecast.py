"""The spill forecast, on plain numbers."""

from __future__ import annotations

import math

from gateway.batches.forecast import LocalRate, forecast_finish, rate_window_s, should_spill


def test_no_rate_is_judged_before_one_window_has_passed() -> None:
    rate = LocalRate(window_s=10.0, started_at=0.0)
    rate.line_finished(1.0)
    assert rate.per_s(5.0) is None
    assert rate.per_s(10.0) == 0.1


def test_the_rate_forgets_lines_older_than_its_window() -> None:
    rate = LocalRate(window_s=10.0, started_at=0.0)
    for at in (1.0, 2.0, 15.0):
        rate.line_finished(at)
    assert rate.per_s(20.0) == 0.1


def test_lines_spill_only_while_the_forecast_finish_passes_the_window_end_less_the_margin(
) -> None:
    # 100 lines at 1 line/s finish at 110 s: later than 200 - 100, sooner than 200 - 50
    assert should_spill(10.0, 100, 1.0, window_end=200.0, margin_s=100.0)
    assert not should_spill(10.0, 100, 1.0, window_end=200.0, margin_s=50.0)


def test_a_stalled_local_backend_spills_everything_once_it_is_measured() -> None:
    assert forecast_finish(0.0, 5, 0.0) == math.inf
    assert should_spill(100.0, 5, 0.0, window_end=86_400.0, margin_s=600.0)


def test_past_the_window_end_less_the_margin_every_line_spills_even_unmeasured() -> None:
    assert not should_spill(10.0, 5, None, window_end=100.0, margin_s=20.0)
    assert should_spill(80.0, 5, None, window_end=100.0, margin_s=20.0)


def test_the_rate_window_follows_the_completion_window_within_bounds() -> None:
    assert rate_window_s(24 * 3600) == 300.0
    assert rate_window_s(600.0) == 30.0
    assert rate_window_s(10.0) == 1.0
