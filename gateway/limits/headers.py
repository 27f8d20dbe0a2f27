"""OpenAI's rate-limit headers and 429 messages, from the window states of a decision.

OpenAI sends, on every response:
  x-ratelimit-limit-requests: 60          x-ratelimit-limit-tokens: 150000
  x-ratelimit-remaining-requests: 59      x-ratelimit-remaining-tokens: 149984
  x-ratelimit-reset-requests: 1s          x-ratelimit-reset-tokens: 6m0s
Durations use Go's format (`120ms`, `1.5s`, `6m0s`, `1h0m0s`). With several
scopes (tenant, key, route) the headers describe the tightest one: the scope
with the fewest remaining. "remaining" is how many more requests (tokens) would
be admitted now, and "reset" when capacity next returns: the time until one more
than remains would fit, if nothing more were admitted meanwhile (the window
counter's weights falling; `window_counter.reset_s`), at most the 60 s window a
per-minute limit promises. (What a window counted keeps weighing while the next one
runs, so one request at the start of a fresh window frees its slot only 90 s later;
a 429's `Retry-After` gives that exact wait.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gateway.limits.store import WINDOW_S, Rejection, ScopeState
from gateway.limits.window_counter import requests_reset_s, tokens_reset_s


def go_duration(seconds: float) -> str:
    """`0.12` → `120ms`, `1.5` → `1.5s`, `360` → `6m0s` (rounded up to the millisecond)."""
    ms = math.ceil(seconds * 1000 - 1e-6)
    if ms < 0:
        ms = 0
    text = _GO_DURATIONS.get(ms)
    if text is None:
        if len(_GO_DURATIONS) >= 4096:  # resets span up to 120,000 distinct values
            _GO_DURATIONS.clear()
        text = _GO_DURATIONS[ms] = _go_duration_ms(ms)
    return text


# Every response carries two of these, and the value changes at most once a
# millisecond (responses in between share it): each formatted once.
_GO_DURATIONS: dict[int, str] = {}


def _go_duration_ms(ms: int) -> str:
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    if ms < 60_000 and ms % 1000 == 0:  # the usual reset of a 60 s window: "59s"
        return f"{ms // 1000}s"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = str(rest // 1000) if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def rate_limit_headers(states: Iterable[ScopeState]) -> dict[str, str]:
    """The six `x-ratelimit-*` headers (a trio is left out when no scope limits it)."""
    # the tightest scope of each kind: (limit, remaining, its state)
    requests: tuple[int, int, ScopeState] | None = None
    tokens: tuple[int, int, ScopeState] | None = None
    for state in states:
        rpm, tpm = state.scope.requests_per_minute, state.scope.tokens_per_minute
        if rpm is not None:
            remaining = rpm - state.requests if state.requests < rpm else 0
            if requests is None or remaining < requests[1]:
                requests = (rpm, remaining, state)
        if tpm is not None:
            remaining = tpm - state.tokens if state.tokens < tpm else 0
            if tokens is None or remaining < tokens[1]:
                tokens = (tpm, remaining, state)
    # Literal names, not f-strings over ("requests", "tokens"), and comparisons, not
    # max()/min() (window_counter.py): built on every response.
    headers: dict[str, str] = {}
    if requests is not None:
        headers["x-ratelimit-limit-requests"] = str(requests[0])
        headers["x-ratelimit-remaining-requests"] = str(requests[1])
        reset_s = requests_reset_s(requests[2])
        headers["x-ratelimit-reset-requests"] = go_duration(
            reset_s if reset_s < WINDOW_S else WINDOW_S)
    if tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(tokens[0])
        headers["x-ratelimit-remaining-tokens"] = str(tokens[1])
        reset_s = tokens_reset_s(tokens[2])
        headers["x-ratelimit-reset-tokens"] = go_duration(
            reset_s if reset_s < WINDOW_S else WINDOW_S)
    return headers


def retry_headers(retry_after_s: float, *, should_retry: bool = True) -> dict[str, str]:
    """`Retry-After` (whole seconds, rounded up) and the SDKs' `retry-after-ms`."""
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s))),
               "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000)))}
    if not should_retry:
        headers["x-should-retry"] = "false"  # the OpenAI SDKs honour it
    return headers


def rate_limit_message(rejection: Rejection, subject: str) -> str:
    """OpenAI's wording, e.g. `Rate limit reached for acme on requests per min (RPM): ...`."""
    unit = "requests per min (RPM)" if rejection.kind == "requests" else "tokens per min (TPM)"
    if rejection.retry_after_s is None:
        return (f"Request too large for {subject} on {unit}: Limit {rejection.limit}, "
                f"Requested {rejection.requested}. The input or output tokens must be "
                "reduced in order to run successfully.")
    return (f"Rate limit reached for {subject} on {unit}: Limit {rejection.limit}, "
            f"Used {rejection.used}, Requested {rejection.requested}. "
            f"Please try again in {go_duration(rejection.retry_after_s)}.")
