"""Where one request's time went, and the `Server-Timing` split that tells the client.

`RequestTimings` collects clock marks as the request moves through the gateway;
`TimingSplit` is the frozen result:

    total = gw + queue + upstream          (exactly, to the microsecond after rounding)

- `queue`: waiting in the gateway's per-backend queue for a slot.
- `upstream`: from sending the upstream request to the end of its response (every
  attempt, when a fallback retried), i.e. network + the backend's own time.
- `gw`: everything else — parsing, auth, rate limit, routing, relaying bytes.
- `ttft`: request arrival → first content token relayed (what the client felt).
- `inference`: the backend's own report of model time (see `inference_time.py`);
  absent when the backend reports nothing — never derived from our clock.
- `upstream-fb`: upstream request sent → response headers, of the attempt that answered.

Other named waits (`add_wait(name, s)`, e.g. a future "admission" wait) are shown
under their own names and, like the queue, are not counted as gateway time.

A stream's headers leave before the upstream finishes, so its header carries the
split as of that moment; the final figures follow in one SSE comment line
(`: server-timing …`, which SDKs ignore) before `data: [DONE]`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.core.inference_time import UNKNOWN, InferenceReport

Clock = Callable[[], float]  # monotonic seconds
# The one clock of durations (routing's statistics, queues and deadlines use it too);
# wall time (`time_ns`) only where a timestamp leaves the process (spans, logs).
MONOTONIC: Clock = time.monotonic


# Made per request: not frozen (a frozen dataclass costs ~3x to build); read-only
# by convention.
@dataclass(slots=True)
class TimingSplit:
    """Milliseconds, rounded to the microsecond; None where not measured or not reported."""

    gw_ms: float
    queue_ms: float
    upstream_ms: float
    total_ms: float
    ttft_ms: float | None = None
    upstream_first_byte_ms: float | None = None  # upstream request sent → response headers
    inter_token_ms: float | None = None  # mean gap between relayed tokens
    inference: InferenceReport = UNKNOWN
    other_waits_ms: tuple[tuple[str, float], ...] = ()  # named waits besides the queue

    @property
    def inference_ms(self) -> float | None:
        return self.inference.inference_ms

    def server_timing(self) -> str:
        """The `Server-Timing` header value (durations in ms, as the spec defines)."""
        # Formatted piece by piece, not from a list of pairs through a generator: this
        # runs on every response.
        text = f"gw;dur={self.gw_ms:.3f}, queue;dur={self.queue_ms:.3f}"
        for name, value in self.other_waits_ms:
            text += f", {name};dur={value:.3f}"
        if self.upstream_first_byte_ms is not None:
            text += f", upstream-fb;dur={self.upstream_first_byte_ms:.3f}"
        text += f", upstream;dur={self.upstream_ms:.3f}"
        if self.ttft_ms is not None:
            text += f", ttft;dur={self.ttft_ms:.3f}"
        inference_ms = self.inference.inference_ms
        if inference_ms is not None:
            text += f", inference;dur={inference_ms:.3f}"
        return text + f", total;dur={self.total_ms:.3f}"

    def sse_comment(self) -> bytes:
        """The final stream line: an SSE comment, so OpenAI SDKs skip it."""
        return f": server-timing {self.server_timing()}\n\n".encode()


def as_ms(seconds: float) -> float:
    """Seconds as milliseconds rounded to the microsecond: `round(seconds * 1000, 3)`
    but for a tie within a float's error, in a third of the time and a tenth of the
    instructions (`round` with digits converts to decimal and back; several durations
    a request are rounded)."""
    return round(seconds * 1_000_000.0) / 1000.0


@dataclass(slots=True)
class RequestTimings:
    """Clock marks of one request. Methods are called by the pipeline as steps happen.
    Durations leave it in milliseconds rounded to the microsecond (`as_ms`)."""

    clock: Clock = MONOTONIC
    start: float = -1.0  # clock() at arrival; negative = now
    queue_s: float = 0.0
    upstream_s: float = 0.0  # finished attempts
    end_s: float | None = None
    inference: InferenceReport = UNKNOWN
    tokens_relayed: int = 0
    waits_s: dict[str, float] = field(default_factory=dict)  # add_wait names but "queue"
    _queue_started_s: float | None = None
    _upstream_started_s: float | None = None
    attempt_started_s: float | None = None  # the latest attempt's start, kept after it ends
    _first_byte_s: float | None = None
    _first_token_s: float | None = None
    _last_token_s: float | None = None
    # The split once `finish()` has fixed the end: asked for again by the metrics, the
    # access log and the Server-Timing header. Every mark below drops it.
    _final: TimingSplit | None = None

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.clock()

    # queue -----------------------------------------------------------------
    def queue_started(self) -> None:
        self._final = None
        self._queue_started_s = self.clock()

    def queue_ended(self) -> float:
        """Stop the queue clock; returns this wait in seconds."""
        if self._queue_started_s is None:
            return 0.0
        self._final = None
        waited = self.clock() - self._queue_started_s
        self.queue_s += waited
        self._queue_started_s = None
        return waited

    # upstream --------------------------------------------------------------
    def upstream_started(self) -> None:
        self.upstream_ended()  # a failed attempt that was never closed still counts
        self._final = None
        self._upstream_started_s = self.attempt_started_s = self.clock()
        self._first_byte_s = None
        # what a failed attempt's backend reported is not the answering attempt's
        self.inference = UNKNOWN

    def upstream_first_byte(self) -> None:
        self._final = None
        self._first_byte_s = self.clock()

    def upstream_ended(self) -> None:
        if self._upstream_started_s is not None:
            self._final = None
            self.upstream_s += self.clock() - self._upstream_started_s
            self._upstream_started_s = None

    def token(self, count: int = 1) -> None:
        """`count` content-bearing events were relayed to the client (one network write)."""
        self._final = None
        now = self.clock()
        if self._first_token_s is None:
            self._first_token_s = now
        self._last_token_s = now
        self.tokens_relayed += count

    def add_wait(self, name: str, seconds: float) -> None:
        """Time spent waiting outside the gateway's control (`queue`, …); not gateway time."""
        self._final = None
        if name == "queue":
            self.queue_s += seconds
        else:
            self.waits_s[name] = self.waits_s.get(name, 0.0) + seconds

    def server_timing(self) -> str:
        """The `Server-Timing` header value as of now."""
        return self.split().server_timing()

    def report(self, report: InferenceReport) -> None:
        if report is not UNKNOWN:  # the usual case for a backend that reports nothing
            self._final = None
            self.inference = self.inference.merged(report)

    def finish(self) -> None:
        if self.end_s is None:
            self.upstream_ended()
            self.end_s = self.clock()

    @property
    def ttft_ms(self) -> float | None:
        """Arrival → first content token relayed (as in `split()`, without building one)."""
        first = self._first_token_s
        return as_ms(first - self.start) if first is not None else None

    @property
    def upstream_first_byte_ms(self) -> float | None:
        """The latest attempt's request sent → response headers (as in `split()`)."""
        if self._first_byte_s is None or self.attempt_started_s is None:
            return None
        return as_ms(self._first_byte_s - self.attempt_started_s)

    # result ----------------------------------------------------------------
    def split(self) -> TimingSplit:
        """The split now (or at `finish()`); open intervals are counted up to now."""
        if self._final is not None:
            return self._final
        now = self.end_s if self.end_s is not None else self.clock()
        queue_s = self.queue_s
        if self._queue_started_s is not None:
            queue_s += now - self._queue_started_s
        upstream_s = self.upstream_s
        if self._upstream_started_s is not None:
            upstream_s += now - self._upstream_started_s
        total_ms = as_ms(now - self.start)
        queue_ms, upstream_ms = as_ms(queue_s), as_ms(upstream_s)
        if self.waits_s:
            other = tuple((name, as_ms(seconds))
                          for name, seconds in self.waits_s.items())
            other_ms = sum(ms for _, ms in other)
        else:
            other, other_ms = (), 0.0
        # gw is the remainder of the rounded figures, so the parts add up exactly.
        gw_ms = total_ms - queue_ms - upstream_ms - other_ms
        gw_ms = round(gw_ms * 1000.0) / 1000.0 if gw_ms > 0.0 else 0.0
        split = TimingSplit(
            gw_ms, queue_ms, upstream_ms, total_ms, self.ttft_ms, self.upstream_first_byte_ms,
            self._inter_token_ms(), self.inference, other,
        )
        if self.end_s is not None:
            self._final = split
        return split

    def _inter_token_ms(self) -> float | None:
        if self.tokens_relayed < 2 or self._first_token_s is None or self._last_token_s is None:
            return None
        gaps_s = self._last_token_s - self._first_token_s
        return as_ms(gaps_s / (self.tokens_relayed - 1))
