"""Live statistics: rolling estimates, load, health, immutable snapshots."""

from hypothesis import given
from hypothesis import strategies as st

from routing.stats import WINDOW_SAMPLES, LiveStats

KEY = "local/llama"


def test_ewma_and_windowed_percentiles_follow_measurements() -> None:
    stats = LiveStats()
    for ttft in range(100, 1100, 100):  # 100 … 1000 ms
        stats.record_success(KEY, network_ms=10.0, ttft_ms=float(ttft), total_ms=ttft + 1000.0,
                             output_tokens=51)
    snap = stats.snapshot().target(KEY)
    assert snap.samples == 10
    assert snap.ttft_p50_ms == 600.0 and snap.ttft_p90_ms == 1000.0
    # The EWMA leans to the recent, slower samples.
    assert snap.ttft_ms is not None and 600.0 < snap.ttft_ms < 1000.0
    assert snap.network_ms == 10.0
    assert snap.decode_tokens_per_s == 50.0  # 50 tokens after the first in 1000 ms


def test_overhead_learns_the_unexplained_part_of_ttft() -> None:
    stats = LiveStats()
    stats.record_success(KEY, network_ms=5.0, ttft_ms=300.0, total_ms=None, output_tokens=0,
                         explained_ttft_ms=100.0)
    assert stats.snapshot().target(KEY).overhead_ms == 200.0


def test_prediction_error_is_actual_minus_predicted() -> None:
    error = LiveStats().record_success(KEY, network_ms=None, ttft_ms=250.0, total_ms=900.0,
                                       output_tokens=10, predicted_ttft_ms=200.0,
                                       predicted_total_ms=1000.0)
    assert (error.ttft_ms, error.total_ms) == (50.0, -100.0)


def test_in_flight_counts_never_go_negative() -> None:
    stats = LiveStats()
    stats.request_started(KEY)
    stats.request_started(KEY)
    stats.request_finished(KEY)
    assert stats.snapshot().target(KEY).in_flight == 1
    stats.request_finished(KEY)
    stats.request_finished(KEY)
    assert stats.snapshot().target(KEY).in_flight == 0


def test_snapshots_are_immutable_and_cached_until_something_changes() -> None:
    stats = LiveStats()
    stats.request_started(KEY)
    first = stats.snapshot()
    assert stats.snapshot() is first
    stats.request_started(KEY)
    assert first.target(KEY).in_flight == 1 and stats.snapshot().target(KEY).in_flight == 2


def test_errors_alone_never_make_a_target_unhealthy() -> None:
    # failures in a row eject it instead (`routing.outliers`), within the route's cap
    stats = LiveStats()
    for second in range(10):
        stats.record_error(KEY, now=float(second))
    snap = stats.snapshot().target(KEY)
    assert snap.healthy(now=10.0) and snap.error_rate > 0.9


def test_a_target_marked_down_is_unhealthy_until_the_given_time() -> None:
    stats = LiveStats()
    stats.mark_unhealthy(KEY, until=50.0)
    assert not stats.snapshot().target(KEY).healthy(49.0)
    assert stats.snapshot().target(KEY).healthy(50.0)


def test_backend_reported_load_goes_stale() -> None:
    stats = LiveStats()
    stats.set_backend_load(KEY, 100.0, waiting=3, running=4, kv_cache_use=0.5)
    snap = stats.snapshot().target(KEY)
    assert snap.backend_waiting == 3 and snap.load_is_fresh(105.0)
    assert not snap.load_is_fresh(1000.0)


def test_unknown_targets_read_as_empty() -> None:
    snap = LiveStats().snapshot().target("nowhere/x")
    assert snap.samples == 0 and snap.in_flight == 0 and snap.healthy(0.0)


def test_a_target_changed_many_times_is_frozen_once_when_read() -> None:
    stats = LiveStats()
    stats.request_started(KEY)
    stats.record_success(KEY, network_ms=1.0, ttft_ms=None, total_ms=10.0, output_tokens=3)
    stats.request_finished(KEY)
    target = stats.snapshot().target(KEY)
    assert (target.in_flight, target.samples, target.service_ms) == (0, 1, 10.0)
    stats.request_queued("other/m")
    assert stats.snapshot().target(KEY) is target  # unchanged targets are not rebuilt


def test_a_target_is_back_no_sooner_than_its_retry_after() -> None:
    stats = LiveStats()
    stats.record_error("a/m", 100.0)
    stats.record_error("b/m", 100.0, retry_after_s=60.0)
    stats.mark_unhealthy("c/m", 130.0)
    snapshot = stats.snapshot()
    assert snapshot.target("a/m").back_at() is None
    assert snapshot.target("b/m").back_at() == 160.0
    assert snapshot.target("c/m").back_at() == 130.0


def test_queued_attempts_are_the_queue_depth_until_they_are_sent() -> None:
    stats = LiveStats()
    for _ in range(3):
        stats.request_queued(KEY)
    stats.request_started(KEY, queued=True)
    stats.request_left_queue(KEY)
    target = stats.snapshot().target(KEY)
    assert (target.queue_depth, target.in_flight) == (1, 1)


def test_a_429_is_not_an_error() -> None:
    stats = LiveStats()
    stats.record_busy(KEY, 100.0, retry_after_s=5.0)
    target = stats.snapshot().target(KEY)
    assert target.error_rate == 0.0 and target.samples == 0
    assert target.retry_after_until == 105.0 and target.healthy(100.0)


def test_an_ejection_is_in_the_snapshot_until_restored() -> None:
    stats = LiveStats()
    stats.eject(KEY, until=9.0)
    assert stats.snapshot().ejected == {KEY: 9.0}
    stats.restore(KEY)
    assert stats.snapshot().ejected == {}


@given(st.lists(st.floats(min_value=0.0, max_value=5_000.0), min_size=1, max_size=400))
def test_windowed_percentiles_are_those_of_the_last_samples_whatever_their_order(
        samples: list[float]) -> None:
    stats = LiveStats()
    for ttft in samples:
        stats.record_success("t", network_ms=None, ttft_ms=ttft, total_ms=None,
                             output_tokens=1)
    window = sorted(samples[-WINDOW_SAMPLES:])
    snap = stats.snapshot().targets["t"]
    assert snap.ttft_p50_ms == window[min(len(window) - 1, int(0.5 * len(window)))]
    assert snap.ttft_p90_ms == window[min(len(window) - 1, int(0.9 * len(window)))]
