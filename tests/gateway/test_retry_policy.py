"""RetryPolicy with plain values: the wait, the advice it honours, the budget."""

from __future__ import annotations

import email.utils
import time

from gateway.core.deadline import Deadline
from gateway.core.failures import (
    ConnectRefused,
    ReadTimeout,
    UpstreamFailure,
    retry_after_s,
    status_failure,
    status_kind,
)
from gateway.pipeline.retries import RetryPolicy
from policies.resilience import Retries

SETTINGS = Retries(max_per_target=2, backoff_base_ms=100, backoff_max_ms=1000,
                   budget_percent=20, budget_window_s=10, min_per_window=0)


def failure(status: int | None, **headers: str) -> UpstreamFailure:
    """The kind the adapter makes of an answer with `status` (None: no connection)."""
    if status is None:
        return ConnectRefused("down")
    kind = status_kind(status)
    assert kind is not None
    return status_failure(kind, "b", status, b"", headers)


def policy(draw: float = 1.0, now: list[float] | None = None) -> RetryPolicy:
    clock = now or [0.0]
    retries = RetryPolicy(clock=lambda: clock[0], draw=lambda: draw)
    for _ in range(100):  # room in the budget: 20 retries
        retries.requested(SETTINGS)
    return retries


def test_the_backoff_is_full_jitter_doubling_per_retry() -> None:
    assert policy(draw=1.0).wait_s(failure(503), 0, SETTINGS, None, 0.0) == 0.1
    assert policy(draw=1.0).wait_s(failure(503), 1, SETTINGS, None, 0.0) == 0.2
    assert policy(draw=0.25).wait_s(failure(503), 1, SETTINGS, None, 0.0) == 0.05


def test_retry_after_wins_when_longer_and_is_refused_past_the_cap() -> None:
    assert policy().wait_s(failure(429, **{"Retry-After": "0.5"}), 0, SETTINGS, None, 0) == 0.5
    assert policy().wait_s(failure(503, **{"retry-after": "3"}), 0, SETTINGS, None, 0) is None


def test_what_is_not_retried() -> None:
    retries = policy()
    assert retries.wait_s(failure(500), 0, SETTINGS, None, 0.0) is None
    assert retries.wait_s(failure(429), 0, SETTINGS, None, 0.0) is None  # no advice
    timeout = ReadTimeout("slow")
    assert retries.wait_s(timeout, 0, SETTINGS, None, 0.0) is None
    assert retries.wait_s(failure(None), 0, SETTINGS, None, 0.0) == 0.1  # connect error
    assert retries.wait_s(failure(529), 2, SETTINGS, None, 0.0) is None  # had its two


def test_no_retry_whose_wait_would_outlast_the_first_token_deadline() -> None:
    deadline = Deadline.of(0.0, 300.0, None)
    assert deadline is not None
    assert policy().wait_s(failure(503), 0, SETTINGS, deadline, 0.15) == 0.1
    assert policy().wait_s(failure(503), 0, SETTINGS, deadline, 0.25) is None


def test_the_budget_allows_a_share_of_the_requests_in_the_window() -> None:
    now = [0.0]
    retries = policy(now=now)
    allowed = [retries.wait_s(failure(503), 0, SETTINGS, None, 0.0) for _ in range(30)]
    assert sum(wait is not None for wait in allowed) == 20
    now[0] = 10.5  # the window has moved past those requests and retries
    assert retries.wait_s(failure(503), 0, SETTINGS, None, 0.0) is None
    for _ in range(5):
        retries.requested(SETTINGS)
    assert retries.wait_s(failure(503), 0, SETTINGS, None, 0.0) is not None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_s({"Retry-After": "2"}) == 2.0
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    seconds = retry_after_s({"Retry-After": later})
    assert seconds is not None and 28 < seconds <= 30
    assert retry_after_s({"Retry-After": "soon"}) is None
    assert retry_after_s({}) is None
