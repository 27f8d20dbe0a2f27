"""OpenAI's header formats."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.limits.headers import go_duration, rate_limit_headers, retry_headers
from gateway.limits.store import Scope, ScopeState
from gateway.limits.window_counter import WINDOW_MS, used


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.006, "6ms"), (0.12, "120ms"), (1, "1s"), (1.5, "1.5s"),
    (59.988, "59.988s"), (60, "1m0s"), (90.5, "1m30.5s"), (360, "6m0s"), (3600, "1h0m0s"),
    (0.0001, "1ms"),
])
def test_durations_use_gos_format_like_openai(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_headers_describe_the_tightest_scope() -> None:
    # ScopeState(scope, requests, tokens, elapsed_ms, previous requests, current
    # requests, previous tokens, current tokens)
    tenant = ScopeState(Scope("tenant", 100, 10_000), 10, 500, 45_000, 0, 10, 0, 500)
    key = ScopeState(Scope("key:ab", 20, None), 10, 0, 30_000, 20, 0, 0, 0)
    headers = rate_limit_headers([tenant, key])
    assert headers == {
        # the key: the window before's 20 weigh 10 half-way through this one, and 9.5
        # (one more fits) 1.5 s later
        "x-ratelimit-limit-requests": "20", "x-ratelimit-remaining-requests": "10",
        "x-ratelimit-reset-requests": "1.5s",
        # the tenant: its 500 weigh in full for the 15 s left of its window, then fall
        # to 499.5 in the next one's first 60 ms
        "x-ratelimit-limit-tokens": "10000", "x-ratelimit-remaining-tokens": "9500",
        "x-ratelimit-reset-tokens": "15.06s",
    }


def test_a_limit_nobody_set_has_no_headers() -> None:
    headers = rate_limit_headers([ScopeState(Scope("tenant", 5, None), 0, 0, 0, 0, 0, 0, 0)])
    assert set(headers) == {"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                            "x-ratelimit-reset-requests"}
    assert headers["x-ratelimit-reset-requests"] == "0s"


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    assert retry_headers(0.2) == {"Retry-After": "1", "retry-after-ms": "200"}
    assert retry_headers(30.5, should_retry=False)["Retry-After"] == "31"
    assert retry_headers(30.5, should_retry=False)["x-should-retry"] == "false"


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 10_000), previous=st.integers(0, 20_000),
       current=st.integers(0, 20_000), elapsed_ms=st.integers(0, WINDOW_MS - 1))
def test_a_reset_is_never_longer_than_the_window(limit: int, previous: int, current: int,
                                                 elapsed_ms: int) -> None:
    counted = used(previous, current, elapsed_ms)
    state = ScopeState(Scope("tenant", limit, limit), counted, counted, elapsed_ms,
                       previous, current, previous, current)
    headers = rate_limit_headers([state])
    for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
        assert seconds_of(headers[name]) <= WINDOW_MS / 1000


def test_one_request_into_a_fresh_window_resets_within_the_minute() -> None:
    state = ScopeState(Scope("tenant", 100, None), 1, 0, 0, 0, 1, 0, 0)
    assert rate_limit_headers([state])["x-ratelimit-reset-requests"] == "1m0s"


def seconds_of(go: str) -> float:
    """A Go duration as written by `go_duration` (`1m0s`, `1.5s`, `120ms`)."""
    if go.endswith("ms"):
        return int(go[:-2]) / 1000
    minutes, _, rest = go.rpartition("m")
    return (int(minutes) * 60 if minutes else 0) + float(rest.rstrip("s"))
