"""The span tree of one request, with GenAI semantic-convention attribute names.

    POST /v1/chat/completions           SERVER  (root; continues an inbound traceparent)
    ├── routegate.auth
    ├── routegate.rate_limit
    ├── routegate.route                 decision attributes (backend, reason, predictions)
    ├── routegate.queue.wait            wait for a backend slot
    └── chat <model>                    CLIENT  (one per attempt; event "gen_ai.first_token")
            └── engine.queue / engine.prefill / engine.decode   (the backend's own spans)

Parents are passed explicitly (never the ambient context), so steps may start and
end spans from different coroutines. With the API's no-op provider every call is
a cheap no-op, and an inbound `traceparent` is still forwarded upstream unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry.light_span import ChildSpans
from gateway.telemetry.semconv import ERROR_TYPE
from gateway.telemetry.span_facts import Facts, attributes_from, note_status

TRACER_NAME = "routegate.gateway"

_PROPAGATOR = TraceContextTextMapPropagator()

AttributeValue = str | bool | int | float | list[str] | list[int] | list[float]


def clean(attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """Drop None values: an unknown figure is absent, never recorded as a placeholder."""
    return {k: v for k, v in attributes.items() if v is not None}


def add_known(pending: dict[str, Any], attributes: Mapping[str, Any]) -> None:
    """`attributes` into `pending`, None values left out (as `clean`)."""
    for key, value in attributes.items():
        if value is not None:
            pending[key] = value


def tracer_of(provider: TracerProvider) -> Tracer:
    """The gateway's tracer; get it once per app (a new one per request costs ~20 µs)."""
    return trace.get_tracer(TRACER_NAME, tracer_provider=provider)


def extract_parent(headers: Mapping[str, str]) -> Context:
    """The caller's trace context from `traceparent`/`tracestate` (empty context if none)."""
    if "traceparent" not in headers:  # the usual case: skip the propagator
        return Context()
    return _PROPAGATOR.extract(carrier=headers)


class Step:
    """`with trace.step(...)`: a class, not @contextmanager (a generator per step cost
    ~3 µs, three steps a request)."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        return self.span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        if exc is not None:
            mark_error(self.span, exc)
        self.span.end()


class RequestTrace:
    """The spans of one request. Create one per request; `end()` closes the root."""

    __slots__ = ("_children", "_inbound", "_pending", "_root", "_root_context", "_root_ctx",
                 "_tracer", "recording")

    def __init__(
        self,
        tracer: Tracer,
        *,
        name: str,
        headers: Mapping[str, str],
        attributes: Mapping[str, Any] | None = None,
        children: ChildSpans | None = None,
    ) -> None:
        """`children`: the cheap path for the root and its children (`light_span.py`);
        without it they go through `tracer.start_span`."""
        self._tracer = tracer
        self._children = children
        # The root's attributes are gathered here and set in one call at end(): each
        # set_attributes call on an SDK span takes its lock and re-validates.
        self._pending: dict[str, Any] = {}
        self._inbound = extract_parent(headers)
        if children is not None:
            self._root: Span = children.root(name, self._inbound, SpanKind.SERVER,
                                             clean(attributes or {}))
        else:
            self._root = self._tracer.start_span(
                name, context=self._inbound, kind=SpanKind.SERVER,
                attributes=clean(attributes or {}))
        self._root_context = self._root.get_span_context()  # the children's parent
        self.recording = self._root.is_recording()
        # Children are only started under a recording root (see start()), and only the
        # SDK's own path (no `children`) starts them from a context.
        self._root_ctx = (trace.set_span_in_context(self._root)
                          if self.recording and children is None else None)

    @property
    def root(self) -> Span:
        return self._root

    @property
    def trace_id(self) -> str | None:
        """32 hex digits, for logs and response headers; None when not traced at all."""
        ctx = self._root.get_span_context()
        if ctx.is_valid:
            return f"{ctx.trace_id:032x}"
        inbound = trace.get_current_span(self._inbound).get_span_context()
        return f"{inbound.trace_id:032x}" if inbound.is_valid else None

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Attributes for the root span (None values are left out), set when it ends."""
        if self.recording:
            add_known(self._pending, attributes)

    def start(self, name: str, attributes: Mapping[str, Any] | None = None) -> Span:
        """A child of the root (INTERNAL); the caller ends it."""
        if not self.recording:
            # Not sampled (or no tracing): the children would not be recorded either, so
            # skip the SDK entirely; the root's own non-recording span stands in (its end()
            # is a no-op) and still carries the trace id and the "not sampled" flag upstream.
            return self._root
        if self._children is not None:
            return self._children.start(name, self._root_context, SpanKind.INTERNAL,
                                        clean(attributes) if attributes else {}, self._root)
        return self._tracer.start_span(
            name, context=self._root_ctx, attributes=clean(attributes) if attributes else None
        )

    @classmethod
    def untraced(cls, headers: Mapping[str, str]) -> RequestTrace:
        """No tracer provider at all: what the no-op provider's root would be (the
        inbound span context, not recording), without building a span or attributes."""
        self = cls.__new__(cls)
        self._tracer = _NO_TRACER
        self._children = None
        self._pending = {}
        self._inbound = extract_parent(headers)
        self._root = trace.get_current_span(self._inbound)
        self._root_context = self._root.get_span_context()
        self.recording = False
        self._root_ctx = None
        return self

    def step(self, name: str, attributes: Mapping[str, Any] | None = None) -> Step:
        """A child span around one pipeline step; an exception marks it as an error."""
        if not self.recording:
            return UNRECORDED_STEP  # nothing to mark or end (see start())
        return Step(self.start(name, attributes))

    def start_upstream(self, name: str, attributes: Mapping[str, Any] | None = None,
                       facts: Facts | None = None) -> Span:
        """The CLIENT span of one upstream attempt; `facts` (`span_facts.py`) add to
        `attributes`."""
        if not self.recording:
            return self._root  # see start()
        if facts is not None:
            attributes = {**(attributes or {}), **attributes_from(facts)}
        if self._children is not None:
            return self._children.start(name, self._root_context, SpanKind.CLIENT,
                                        clean(attributes) if attributes else {}, self._root)
        return self._tracer.start_span(
            name, context=self._root_ctx, kind=SpanKind.CLIENT,
            attributes=clean(attributes) if attributes else None,
        )

    def inject(self, span: Span, headers: MutableMapping[str, str]) -> None:
        """Put `traceparent` (and `tracestate`) for `span` into an upstream request's headers.

        Without a recording provider the inbound context is forwarded as it came, so a
        backend that traces still joins the caller's trace.
        """
        context = span.get_span_context()
        if context.is_valid:  # what the W3C propagator writes, without its context lookups
            headers["traceparent"] = (
                f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}")
            if context.trace_state:
                headers["tracestate"] = context.trace_state.to_header()
            return
        if self._inbound:  # no inbound context (the usual case): nothing to forward
            _PROPAGATOR.inject(headers, context=self._inbound)

    def end(self, status_code: int, error_type: str | None = None) -> None:
        if self.recording:
            pending = self._pending
            if note_status(pending, status_code, error_type):
                self._root.set_status(Status(StatusCode.ERROR))
            self._root.set_attributes(pending)
        self._root.end()

    def close(self, facts: Facts, status_code: int, error_type: str | None = None) -> None:
        """End a recording root with the request's facts (`span_facts.py`) as attributes."""
        self.set(attributes_from(facts))
        self.end(status_code, error_type)


_NO_TRACER = trace.NoOpTracer()
# Stateless: a step of a request that is not recorded has no span of its own.
UNRECORDED_STEP = Step(trace.INVALID_SPAN)


def mark_error(span: Span, exc: BaseException) -> None:
    if span.is_recording():
        span.set_attribute(ERROR_TYPE, type(exc).__name__)
        span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
