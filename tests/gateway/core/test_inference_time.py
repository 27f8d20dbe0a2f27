from __future__ import annotations

import pytest

from gateway.core.inference_time import (
    InferenceReport,
    from_body,
    from_headers,
    parse_server_timing,
)


def test_no_timing_headers_means_unknown_not_zero() -> None:
    report = from_headers({"content-type": "application/json"})
    assert not report.known
    assert report.inference_ms is None


def test_openai_processing_ms_is_the_servers_total() -> None:
    report = from_headers({"openai-processing-ms": "412"})
    assert report.server_total_ms == 412
    assert report.inference_ms is None
    assert report.source == "openai"


def test_tgi_reports_inference_and_queue_in_milliseconds() -> None:
    headers = {"x-inference-time": "830", "x-queue-time": "12", "x-compute-time": "0.9"}
    report = from_headers(headers)
    assert report.inference_ms == 830
    assert report.queue_ms == 12


def test_local_backend_server_timing_header_is_read_field_by_field() -> None:
    header = (
        "queue;dur=1.5, prefill;dur=20.25, ttft;dur=22, decode;dur=300, "
        "inference;dur=320.25, total;dur=323"
    )
    report = from_headers({"Server-Timing": header})
    assert report.as_dict() == {
        "queue_ms": 1.5, "prefill_ms": 20.25, "ttft_ms": 22.0, "decode_ms": 300.0,
        "inference_ms": 320.25, "server_total_ms": 323.0,
    }


def test_server_timing_parser_skips_entries_without_duration() -> None:
    assert parse_server_timing('miss, db;dur=53, app;desc="x";dur=47.2, bad;dur=-1') == {
        "db": 53.0, "app": 47.2,
    }


def test_local_backend_timings_object_in_the_final_body() -> None:
    body = {"choices": [], "timings": {"queue_ms": 2, "prefill_ms": 10, "decode_ms": 90,
                                       "inference_ms": 100, "server_total_ms": 103}}
    report = from_body(body)
    assert report.inference_ms == 100
    assert report.ttft_ms is None


def test_vllm_request_metrics_are_converted_from_seconds() -> None:
    body = {"metrics": {"arrival_time": 100.0, "first_scheduled_time": 100.010,
                        "first_token_time": 100.060, "last_token_time": 100.560,
                        "finished_time": 100.561, "time_in_queue": 0.010}}
    report = from_body(body)
    assert report.queue_ms == pytest.approx(10)
    assert report.prefill_ms == pytest.approx(50)
    assert report.ttft_ms == pytest.approx(60)
    assert report.decode_ms == pytest.approx(500)
    assert report.inference_ms == pytest.approx(550)
    assert report.source == "vllm"


def test_malformed_values_are_ignored_rather_than_guessed() -> None:
    assert not from_headers({"x-inference-time": "soon", "openai-processing-ms": "nan"}).known
    assert not from_body({"timings": {"inference_ms": "fast"}}).known
    assert not from_body({"timings": "100ms"}).known


def test_later_reports_fill_in_and_override_earlier_ones() -> None:
    header = InferenceReport(queue_ms=3, ttft_ms=40, source="server-timing")
    final = InferenceReport(ttft_ms=41, inference_ms=500, source="body")
    merged = header.merged(final)
    assert (merged.queue_ms, merged.ttft_ms, merged.inference_ms) == (3, 41, 500)
    assert merged.source == "server-timing+body"
