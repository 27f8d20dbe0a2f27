from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.inference_time import InferenceReport, parse_server_timing
from gateway.core.timing import RequestTimings
from tests.gateway.telemetry.fake_clock import FakeClock


def test_split_attributes_time_to_gateway_queue_and_upstream() -> None:
    clock = FakeClock()
    t = RequestTimings(clock=clock)
    clock.advance_ms(2)  # parse, auth, route
    t.queue_started()
    clock.advance_ms(30)
    t.queue_ended()
    t.upstream_started()
    clock.advance_ms(100)
    t.upstream_first_byte()
    clock.advance_ms(50)
    t.token()
    clock.advance_ms(200)
    t.upstream_ended()
    clock.advance_ms(1)
    t.finish()
    split = t.split()
    assert split.total_ms == pytest.approx(383)
    assert split.queue_ms == pytest.approx(30)
    assert split.upstream_ms == pytest.approx(350)
    assert split.gw_ms == pytest.approx(3)
    assert split.upstream_first_byte_ms == pytest.approx(100)
    assert split.ttft_ms == pytest.approx(182)


def test_server_timing_header_names_every_figure_in_order() -> None:
    clock = FakeClock()
    t = RequestTimings(clock=clock)
    t.upstream_started()
    clock.advance_ms(5)
    t.upstream_first_byte()
    clock.advance_ms(10)
    t.token()
    t.report(InferenceReport(inference_ms=7.5))
    t.finish()
    header = t.split().server_timing()
    assert list(parse_server_timing(header)) == [
        "gw", "queue", "upstream-fb", "upstream", "ttft", "inference", "total"
    ]
    assert "inference;dur=7.500" in header


def test_inference_is_absent_from_the_header_when_the_backend_reports_nothing() -> None:
    t = RequestTimings(clock=FakeClock())
    t.finish()
    assert "inference" not in parse_server_timing(t.split().server_timing())


def test_a_fallback_counts_every_upstream_attempt_as_upstream_time() -> None:
    clock = FakeClock()
    t = RequestTimings(clock=clock)
    t.upstream_started()
    clock.advance_ms(40)  # first backend refuses
    t.upstream_ended()
    t.upstream_started()
    clock.advance_ms(60)
    t.upstream_first_byte()
    t.finish()
    split = t.split()
    assert split.upstream_ms == pytest.approx(100)
    assert split.upstream_first_byte_ms == pytest.approx(60)  # of the attempt that answered


def test_split_before_finish_counts_open_intervals_up_to_now() -> None:
    clock = FakeClock()
    t = RequestTimings(clock=clock)
    t.upstream_started()
    clock.advance_ms(25)
    t.upstream_first_byte()  # a stream's headers go out here
    early = t.split()
    assert early.upstream_ms == pytest.approx(25)
    assert early.total_ms == pytest.approx(25)


def test_inter_token_latency_is_the_mean_gap_between_tokens() -> None:
    clock = FakeClock()
    t = RequestTimings(clock=clock)
    for _ in range(5):
        t.token()
        clock.advance_ms(20)
    assert t.split().inter_token_ms == pytest.approx(20)


def test_stream_trailer_is_an_sse_comment_line() -> None:
    t = RequestTimings(clock=FakeClock())
    t.finish()
    line = t.split().sse_comment()
    assert line.startswith(b": server-timing gw;dur=")
    assert line.endswith(b"\n\n")


durations = st.floats(min_value=0, max_value=60_000, allow_nan=False)


@given(before=durations, queue=durations, upstream=durations, after=durations)
def test_gw_plus_queue_plus_upstream_equals_total_within_a_millisecond(
    before: float, queue: float, upstream: float, after: float
) -> None:
    clock = FakeClock(start=12345.678)
    t = RequestTimings(clock=clock)
    clock.advance_ms(before)
    t.queue_started()
    clock.advance_ms(queue)
    t.queue_ended()
    t.upstream_started()
    clock.advance_ms(upstream)
    t.upstream_ended()
    clock.advance_ms(after)
    t.finish()
    figures = parse_server_timing(t.split().server_timing())
    assert abs(figures["gw"] + figures["queue"] + figures["upstream"] - figures["total"]) <= 1.0
    assert figures["gw"] >= 0


def test_named_waits_reported_by_plug_ins_are_not_gateway_time() -> None:
    clock = FakeClock()
    t = RequestTimings(clock=clock)
    clock.advance_ms(50)
    t.add_wait("queue", 0.030)
    t.add_wait("admission", 0.010)
    t.finish()
    figures = parse_server_timing(t.server_timing())
    assert figures["queue"] == 30 and figures["admission"] == 10
    assert figures["gw"] == 10


def test_an_unclosed_failed_attempt_is_still_upstream_time() -> None:
    clock = FakeClock()
    t = RequestTimings(clock=clock)
    t.upstream_started()
    clock.advance_ms(30)  # connection refused; the pipeline moves on without closing
    t.upstream_started()
    clock.advance_ms(20)
    t.upstream_ended()
    t.finish()
    assert t.split().upstream_ms == 50
