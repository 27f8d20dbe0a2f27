"""Every Prometheus metric the gateway exports, in one registry it owns.

Labels are bounded: route, backend, model and tenant names come from the policy
file, status is an HTTP status code, reason/limit/priority are small fixed sets.
`LabelGuard` is the safety net if a caller ever passes something unbounded
(a client-chosen model name, say): past `max_values` distinct values per label,
further ones are folded into `other`.

The series are plain numbers (`metric_series`), updated without locks on the event
loop's thread and turned into Prometheus families only when `/metrics` is read: a
request's dozen updates cost ~2.3 µs instead of prometheus_client's ~10. A replica is
one process; Prometheus scrapes each replica and sums across them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gateway.core.record import RequestRecord
from gateway.core.timing import TimingSplit
from gateway.telemetry.metric_series import (
    CounterFamily,
    CounterSeries,
    GaugeFamily,
    GaugeSeries,
    HistogramFamily,
    HistogramSeries,
)
from gateway.telemetry.prompt_tokens import PromptTokens

NAMESPACE = "routegate"
OTHER = "other"
NONE = "none"  # the label of what a request never had: a route, a backend, a tenant

# Seconds. Gateway overhead is sub-millisecond to a few ms; model calls run to minutes.
OVERHEAD_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
# actual − predicted: negative buckets too (faster than routing expected).
PREDICTION_ERROR_BUCKETS_S = (-10.0, -5.0, -2.5, -1.0, -0.5, -0.25, -0.1, -0.05, -0.025, 0.0,
                              0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TOKEN_GAP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)


class LabelGuard:
    """Caps the distinct values one label may take; thread-safe (a first sighting locks)."""

    def __init__(self, max_values: int = 256) -> None:
        self.max_values = max_values
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, label: str, value: str | None) -> str:
        value = value or ""
        seen = self._seen.get(label)
        if seen is not None and value in seen:
            return value
        with self._lock:
            seen = self._seen.setdefault(label, set())
            if value in seen:
                return value
            if len(seen) >= self.max_values:
                return OTHER
            seen.add(value)
            return value


MAX_CACHED_COMBINATIONS = 4096


@dataclass(frozen=True, slots=True)
class _RequestChildren:
    duration: HistogramSeries
    requests: CounterSeries
    overhead: HistogramSeries
    # None for a request no backend took: no series with an empty `backend` label
    queue: HistogramSeries | None
    first_byte: HistogramSeries | None
    ttft: HistogramSeries | None
    inter_token: HistogramSeries | None
    inference: HistogramSeries | None
    tokens_in: CounterSeries
    tokens_out: CounterSeries
    spend: CounterSeries


class GatewayMetrics:
    """The gateway's metrics. One instance per app; nothing global."""

    def __init__(self, *, max_label_values: int = 256):
        self.registry = CollectorRegistry(auto_describe=True)
        self.prompt_tokens = PromptTokens()  # per backend and replica, cached share
        self.label = LabelGuard(max_label_values)
        self._children: dict[tuple[str, str, str, str, int, str], _RequestChildren] = {}
        # Series of the per-request gauges and the decision counter by raw (unguarded)
        # label values, kept so a request skips the guard; bounded like `_children`.
        self._per_backend: dict[tuple[str, str], GaugeSeries] = {}
        self._decision_children: dict[tuple[str, str, str], CounterSeries] = {}
        self._prediction_children: dict[
            tuple[str, str], tuple[HistogramSeries, HistogramSeries]] = {}
        r = self.registry

        def hist(name: str, doc: str, labels: list[str],
                 buckets: tuple[float, ...]) -> HistogramFamily:
            return HistogramFamily(f"{NAMESPACE}_{name}", doc, labels, buckets, registry=r)

        def counter(name: str, doc: str, labels: list[str]) -> CounterFamily:
            return CounterFamily(f"{NAMESPACE}_{name}", doc, labels, registry=r)

        def gauge(name: str, doc: str, labels: list[str]) -> GaugeFamily:
            return GaugeFamily(f"{NAMESPACE}_{name}", doc, labels, registry=r)

        e2e = ["route", "backend", "model", "tenant", "status"]
        rbm = ["route", "backend", "model"]
        bm = ["backend", "model"]
        self.request_duration = hist(
            "request_duration_seconds", "End-to-end time, request received → response done.",
            e2e, LATENCY_BUCKETS_S,
        )
        self.gateway_overhead = hist(
            "gateway_overhead_seconds", "Time in the gateway itself: total − queue − upstream.",
            ["route", "backend"], OVERHEAD_BUCKETS_S,
        )
        self.queue_wait = hist(
            "queue_wait_seconds", "Wait in the gateway's per-backend queue for a slot.",
            ["backend", "priority"], LATENCY_BUCKETS_S,
        )
        self.upstream_first_byte = hist(
            "upstream_first_byte_seconds", "Upstream request sent → upstream response headers.",
            bm, LATENCY_BUCKETS_S,
        )
        self.ttft = hist(
            "ttft_seconds", "Request received → first content token relayed to the client.",
            rbm, LATENCY_BUCKETS_S,
        )
        self.inter_token = hist(
            "inter_token_latency_seconds", "Mean gap between relayed tokens, one per stream.",
            bm, TOKEN_GAP_BUCKETS_S,
        )
        self.inference = hist(
            "inference_seconds", "Inference time the backend reported (if it did).",
            bm, LATENCY_BUCKETS_S,
        )
        self.prediction_error = hist(
            "routing_prediction_error_seconds",
            "Actual − predicted time of the routed attempt (positive: slower than predicted).",
            [*bm, "kind"], PREDICTION_ERROR_BUCKETS_S,
        )
        self.requests = counter("requests", "Requests finished, by status code.", e2e)
        self.tokens = counter(
            "tokens", "Tokens processed (direction = input | output).",
            ["route", "backend", "model", "tenant", "direction"],
        )
        self.spend = counter(
            "spend_usd", "Spend in US dollars, at the policy's prices.",
            ["route", "backend", "model", "tenant"],
        )
        self.decisions = counter(
            "routing_decisions", "Routing decisions by chosen backend and reason.",
            ["route", "backend", "reason"],
        )
        self.rate_limited = counter(
            "rate_limit_rejections", "Requests refused by a rate limit or budget.",
            ["tenant", "limit"],
        )
        self.shed = counter(
            "shed_rejections", "Requests shed by a full or overloaded backend queue.",
            ["backend", "priority"],
        )
        self.fallbacks = counter(
            "fallbacks", "Attempts moved to the next candidate after a failure before first byte.",
            ["route", "from_backend", "to_backend"],
        )
        self.policy_reloads = counter(
            "policy_reloads", "Policy file reloads (result = ok | invalid).", ["result"],
        )
        self.trace_spans_dropped = counter(
            "trace_spans_dropped", "Trace spans dropped before export (export queue or "
            "exporter full, exporter process down): export never blocks a request.", [],
        )
        self._spans_dropped_seen = 0
        self.in_flight = gauge(
            "in_flight", "Upstream requests in flight per backend.", ["backend"],
        )
        self.retries = counter(
            "retries", "Attempts retried on the same backend (connect error, 503, 529, 429 "
            "with Retry-After), within the retry budget.", ["backend"],
        )
        self.upstream_failures = counter(
            "upstream_failures", "Failed upstream attempts by the failure's kind "
            "(`reason`: connect_refused, read_timeout, rate_limited, overloaded, …).",
            ["backend", "reason"],
        )
        self.resends = counter(
            "upstream_resends", "Requests sent again on a new connection because a kept-alive "
            "one failed before any byte of an answer (the backend closed or reset it).",
            ["backend"],
        )
        self.ejections = counter(
            "outlier_ejections", "Targets ejected after connect errors, timeouts or 5xx in "
            "a row (a failed probe ejects again).", bm,
        )
        self.target_ejected = gauge(
            "target_ejected", "1 while a target is out of service by outlier ejection.", bm,
        )
        self.queue_depth = gauge(
            "queue_depth", "Requests waiting in the gateway's queue per backend.", ["backend"],
        )

    # recorders: label order and the label guard live here, not at the call sites -----
    def observe_record(self, record: RequestRecord) -> None:
        """Everything one finished request contributes, read from its record."""
        assert record.split is not None
        self.prompt_tokens.observe(record)
        if record.route is not None and record.reason is not None:
            self.observe_decision(record.route, record.decided_backend or "", record.reason)
        for attempt in record.attempts:
            if attempt.failure is not None:
                self.upstream_failures.labels(self.label("backend", attempt.backend),
                                              attempt.failure).inc()
        for from_backend, to_backend in record.fallbacks():
            self.observe_fallback(record.route or "", from_backend, to_backend)
        if record.rejection == "shed":
            self.observe_shed(record.backend or "", record.priority)
        elif record.rejection is not None:
            self.observe_rejection(record.tenant or "", record.rejected_limit or record.rejection)
        self.observe_request(
            route=record.route or "", backend=record.backend or "", model=record.model or "",
            tenant=record.tenant or "", priority=record.priority, status=record.status,
            split=record.split, input_tokens=record.input_tokens,
            output_tokens=record.output_tokens, cost_usd=record.cost_usd)

    def observe_request(
        self,
        *,
        route: str,
        backend: str,
        model: str,
        tenant: str,
        status: int,
        split: TimingSplit,
        priority: str = "normal",
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cost_usd: float | None = None,
    ) -> None:
        """Everything one finished request contributes; unknown figures are skipped."""
        c = self._request_children(route, backend, model, tenant, status, priority)
        c.duration.observe(split.total_ms / 1000.0)
        c.requests.inc()
        c.overhead.observe(split.gw_ms / 1000.0)
        if c.queue is not None:
            c.queue.observe(split.queue_ms / 1000.0)
        if split.upstream_first_byte_ms is not None and c.first_byte is not None:
            c.first_byte.observe(split.upstream_first_byte_ms / 1000.0)
        if split.ttft_ms is not None and c.ttft is not None:
            c.ttft.observe(split.ttft_ms / 1000.0)
        if split.inter_token_ms is not None and c.inter_token is not None:
            c.inter_token.observe(split.inter_token_ms / 1000.0)
        if split.inference_ms is not None and c.inference is not None:
            c.inference.observe(split.inference_ms / 1000.0)
        if input_tokens:
            c.tokens_in.inc(input_tokens)
        if output_tokens:
            c.tokens_out.inc(output_tokens)
        if cost_usd:
            c.spend.inc(cost_usd)

    def _request_children(
        self, route: str, backend: str, model: str, tenant: str, status: int,
        priority: str = "normal",
    ) -> _RequestChildren:
        """The labelled series of one label combination, looked up once and kept: the
        guard and eleven `labels()` look-ups would cost more than the updates."""
        key = (route, backend, model, tenant, status, priority)
        children = self._children.get(key)
        if children is None:
            if len(self._children) >= MAX_CACHED_COMBINATIONS:
                self._children.clear()  # bounded; the series themselves stay in their family
            g = self.label
            served = bool(backend)
            route, backend, model, tenant = (
                g("route", route or NONE), g("backend", backend or NONE),
                g("model", model or NONE), g("tenant", tenant or NONE))
            code = str(status)
            children = self._children[key] = _RequestChildren(
                duration=self.request_duration.labels(route, backend, model, tenant, code),
                requests=self.requests.labels(route, backend, model, tenant, code),
                overhead=self.gateway_overhead.labels(route, backend),
                queue=self.queue_wait.labels(backend, g("priority", priority)) if served else None,
                first_byte=self.upstream_first_byte.labels(backend, model) if served else None,
                ttft=self.ttft.labels(route, backend, model) if served else None,
                inter_token=self.inter_token.labels(backend, model) if served else None,
                inference=self.inference.labels(backend, model) if served else None,
                tokens_in=self.tokens.labels(route, backend, model, tenant, "input"),
                tokens_out=self.tokens.labels(route, backend, model, tenant, "output"),
                spend=self.spend.labels(route, backend, model, tenant),
            )
        return children

    def observe_prediction_error(self, backend: str, model: str, *, ttft_ms: float | None,
                                 total_ms: float | None) -> None:
        """How far routing's latency prediction was off, so ops can see if it is informed."""
        children = self._prediction_children.get((backend, model))
        if children is None:
            if len(self._prediction_children) >= MAX_CACHED_COMBINATIONS:
                self._prediction_children.clear()
            g = self.label
            labels = g("backend", backend), g("model", model)
            children = self._prediction_children[(backend, model)] = (
                self.prediction_error.labels(*labels, "ttft"),
                self.prediction_error.labels(*labels, "total"))
        if ttft_ms is not None:
            children[0].observe(ttft_ms / 1000.0)
        if total_ms is not None:
            children[1].observe(total_ms / 1000.0)

    def observe_dropped_spans(self, dropped_so_far: int) -> None:
        """The exporter's running count of dropped spans (read periodically)."""
        if dropped_so_far > self._spans_dropped_seen:
            self.trace_spans_dropped.labels().inc(dropped_so_far - self._spans_dropped_seen)
            self._spans_dropped_seen = dropped_so_far

    def observe_rejection(self, tenant: str, limit: str) -> None:
        self.rate_limited.labels(self.label("tenant", tenant or NONE), limit).inc()

    def observe_shed(self, backend: str, priority: str) -> None:
        self.shed.labels(self.label("backend", backend or NONE), priority).inc()

    def observe_decision(self, route: str, backend: str, reason: str) -> None:
        key = (route, backend, reason)
        child = self._decision_children.get(key)
        if child is None:
            if len(self._decision_children) >= MAX_CACHED_COMBINATIONS:
                self._decision_children.clear()
            child = self._decision_children[key] = self.decisions.labels(
                self.label("route", route), self.label("backend", backend),
                self.label("reason", reason))
        child.inc()

    def in_flight_of(self, backend: str) -> GaugeSeries:
        """`in_flight` for one backend (its series, cached): `inc()` / `dec()`."""
        return self._backend_gauge("in_flight", self.in_flight, backend)

    def queue_depth_of(self, backend: str) -> GaugeSeries:
        """`queue_depth` for one backend (its series, cached): `inc()` / `dec()`."""
        return self._backend_gauge("queue_depth", self.queue_depth, backend)

    def _backend_gauge(self, name: str, gauge: GaugeFamily, backend: str) -> GaugeSeries:
        child = self._per_backend.get((name, backend))
        if child is None:
            if len(self._per_backend) >= MAX_CACHED_COMBINATIONS:
                self._per_backend.clear()
            child = self._per_backend[(name, backend)] = gauge.labels(
                self.label("backend", backend))
        return child

    def observe_retry(self, backend: str) -> None:
        self.retries.labels(self.label("backend", backend)).inc()

    def observe_resend(self, backend: str) -> None:
        self.resends.labels(self.label("backend", backend)).inc()

    def observe_ejection(self, backend: str, model: str, *, ejected: bool) -> None:
        """A target was ejected (`ejected`) or put back in service."""
        labels = (self.label("backend", backend), self.label("model", model))
        if ejected:
            self.ejections.labels(*labels).inc()
        self.target_ejected.labels(*labels).set(1 if ejected else 0)

    def observe_fallback(self, route: str, from_backend: str, to_backend: str) -> None:
        self.fallbacks.labels(
            self.label("route", route),
            self.label("backend", from_backend),
            self.label("backend", to_backend),
        ).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for `GET /metrics`."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
