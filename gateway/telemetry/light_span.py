"""Child spans of a traced request, recorded as plain values and handed to the span
processor as finished `ReadableSpan`s.

The SDK's `Tracer.start_span` costs ~45 µs a span on this path (sampler, id
generator, a `Span` with its lock, attribute validation, `on_start` of every
processor), and a request has five children. Their parent is the request's root,
which the SDK has already sampled, so none of that is needed for them: a
`LightSpan` takes two clock readings, keeps its attributes in a dict, and at
`end()` gives the processor (batch export, or a test's in-memory exporter) the same
`ReadableSpan` the SDK would have.

The root is recorded the same way (`ChildSpans.root`), after the same steps as
`Tracer.start_span`: the parent from the inbound context, the tracer's own sampler
(its decision, attributes and trace state) and id generator. Only a sampled root
is a `LightSpan`; an unsampled one is the API's `NonRecordingSpan`, as the SDK's.

Attribute values are the gateway's own (str, bool, int, float, lists of those;
callers drop `None` with `spans.clean`), so they are not validated again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from time import time_ns
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    get_current_span,
)
from opentelemetry.util.types import Attributes, AttributeValue

_UNSET = Status(StatusCode.UNSET)


def _frozen(attributes: dict[str, Any]) -> dict[str, Any]:
    """Lists become tuples, as the SDK stores them, for a `ReadableSpan`. The OTLP path
    encodes a light span's own dict as it is: its lists are fresh ones the span alone
    holds, and nothing changes them once it has ended."""
    return {key: tuple(value) if type(value) is list else value
            for key, value in attributes.items()}


SAMPLED = TraceFlags(TraceFlags.SAMPLED)
SPANS_PER_REQUEST = 6  # root, auth, rate limit, route, queue wait, upstream


class ChildSpans:
    """What a `LightSpan` needs from the SDK tracer: its processor, resource, scope and
    span ids. `for_tracer` returns None for anything but the SDK's tracer (the no-op
    API tracer, another SDK), and the caller keeps the ordinary path."""

    __slots__ = ("_ids", "_new_span_id", "_on_end", "_resource", "_sampler", "_scope",
                 "_tracer")

    def __init__(self, on_end: Callable[[ReadableSpan], None], resource: Any, scope: Any,
                 new_span_id: Callable[[], int], tracer: Any = None) -> None:
        self._on_end, self._resource, self._scope = on_end, resource, scope
        self._new_span_id = new_span_id
        self._tracer = tracer
        self._sampler = getattr(tracer, "sampler", None)
        self._ids = getattr(tracer, "id_generator", None)

    @classmethod
    def for_tracer(cls, tracer: Tracer) -> ChildSpans | None:
        processor = getattr(tracer, "span_processor", None)
        ids = getattr(tracer, "id_generator", None)
        scope = getattr(tracer, "_instrumentation_scope", None)
        if processor is None or ids is None or scope is None:
            return None
        direct = _direct_sink(processor)
        on_end = direct if direct is not None else processor.on_end
        return cls(on_end, getattr(tracer, "resource", None), scope, ids.generate_span_id,
                   tracer)

    def root(self, name: str, context: Context, kind: SpanKind,
             attributes: dict[str, Any]) -> Span:
        """A request's root span, as `Tracer.start_span(name, context, kind, attributes)`
        would make it (~10 instead of ~45 µs); the SDK's own call where this tracer lacks
        what that needs (a sampler, or a tracer configuration that disables it)."""
        tracer, sampler, ids = self._tracer, self._sampler, self._ids
        enabled = getattr(tracer, "_is_enabled", None)
        if sampler is None or ids is None or (enabled is not None and not enabled()):
            return tracer.start_span(name, context=context, kind=kind,
                                     attributes=attributes)
        parent: SpanContext | None = get_current_span(context).get_span_context()
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = ids.generate_trace_id()
            random_id = ids.is_trace_id_random()
        else:
            trace_id = parent.trace_id
            random_id = parent.trace_flags.random_trace_id
        result = sampler.should_sample(context, trace_id, name, kind, attributes, ())
        flags = TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        span_context = SpanContext(trace_id, ids.generate_span_id(), False, TraceFlags(flags),
                                   result.trace_state)
        if not result.decision.is_recording():
            return NonRecordingSpan(span_context)
        return self._recording_root(name, span_context, parent, kind,
                                    dict(result.attributes or {}))

    def _recording_root(self, name: str, context: SpanContext, parent: SpanContext | None,
                        kind: SpanKind, attributes: dict[str, Any]) -> Span:
        return LightSpan(self, name, context, parent, kind, attributes)

    def start(self, name: str, parent: SpanContext, kind: SpanKind,
              attributes: dict[str, Any], root: Span | None = None) -> LightSpan:
        """A child of `parent`; given its light `root`, the child is handed over together
        with the root when the root ends (one hand-off per request on the direct path)."""
        context = SpanContext(parent.trace_id, self._new_span_id(), False, SAMPLED,
                              parent.trace_state)
        span = LightSpan(self, name, context, parent, kind, attributes)
        if type(root) is LightSpan and type(self._on_end) is _Direct:
            span._root = root
        return span

    def emit(self, span: LightSpan) -> None:
        on_end = self._on_end
        if type(on_end) is _Direct:
            root = span._root
            if root is not None and not root._ended:
                root._held.append(span)  # goes with the root, the request's last span
                return
            held = span._held
            if held:  # the request's spans, children first as they ended: one queue item
                held.append(span)
                on_end.queue(held)
                span._held = []
            else:  # the span itself: it reads like a ReadableSpan to the encoder
                on_end.queue(span)
            return
        on_end(ReadableSpan(
            span.name, span.context, span.parent, self._resource, _frozen(span.attributes),
            tuple(span.events), (), span.kind, None, span.status, span.start_time,
            span.end_time, self._scope))


class _Direct:
    """The batch queue of the one `BatchSpanProcessor` of a provider whose exporter
    encodes spans itself (`FastOtlpHttpExporter`): finished light spans go in as they
    are, without a `ReadableSpan` each and the processors' per-span dispatch."""

    __slots__ = ("queue",)

    def __init__(self, queue: Callable[[Any], None]) -> None:
        self.queue = queue

    def __call__(self, span: ReadableSpan) -> None:
        self.queue(span)


def _direct_sink(processor: Any) -> _Direct | None:
    """`_Direct` when `processor` (the provider's multi-processor) holds exactly one
    batch processor, in front of an exporter that says it takes light spans; else None
    (a console exporter, gRPC, several processors, a test's in-memory exporter)."""
    inner = getattr(processor, "_span_processors", None)
    if not isinstance(inner, tuple) or len(inner) != 1:
        return None
    (batch,) = inner
    exporter = getattr(batch, "span_exporter", None)
    queue = getattr(batch, "_batch_processor", None)
    emit = getattr(queue, "emit", None)
    if emit is None or not getattr(exporter, "takes_light_spans", False):
        return None
    _count_requests(queue)
    return _Direct(emit)


def _count_requests(queue: Any) -> None:
    """The batch queue's limits (`OTEL_BSP_MAX_QUEUE_SIZE`, `_MAX_EXPORT_BATCH_SIZE`)
    count spans; its items here are mostly whole requests, so they are divided by a
    request's spans. Once per queue; left alone if the SDK's queue is not as expected."""
    size, batch = getattr(queue, "_max_queue_size", None), getattr(
        queue, "_max_export_batch_size", None)
    old = getattr(queue, "_queue", None)
    if (getattr(queue, "_routegate_per_request", False) or not isinstance(size, int)
            or not isinstance(batch, int) or not isinstance(old, deque) or old):
        return
    queue._max_queue_size = max(1, size // SPANS_PER_REQUEST)
    queue._queue = deque(maxlen=queue._max_queue_size)
    queue._max_export_batch_size = max(1, batch // SPANS_PER_REQUEST)
    queue._routegate_per_request = True


class PlainSpan(Span):
    """What the gateway's own recording spans share: attributes in a plain dict, no
    links, nothing recorded once ended."""

    __slots__ = ()
    _ended: bool
    attributes: dict[str, Any]
    name: str

    def is_recording(self) -> bool:
        return not self._ended

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if not self._ended:
            self.attributes[key] = list(value) if type(value) is list else value

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        """Values as given: the gateway's callers pass fresh lists (see `_frozen`)."""
        if not self._ended:
            self.attributes.update(attributes)

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        return None  # the gateway's spans have no links

    def update_name(self, name: str) -> None:
        self.name = name

    def record_exception(self, exception: BaseException, attributes: Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        self.add_event("exception", {"exception.type": type(exception).__name__,
                                     "exception.message": str(exception)[:200]}, timestamp)


class LightSpan(PlainSpan):
    """A recording span; once ended, it has what the OTLP encoder reads of a
    `ReadableSpan` (`start_time`, `end_time`, `resource`, `instrumentation_scope`, …)."""

    __slots__ = ("_ended", "_held", "_root", "_sink", "attributes", "context", "end_time",
                 "events", "kind", "name", "parent", "start_time", "status")

    dropped_attributes = 0
    links: tuple[Any, ...] = ()

    def __init__(self, sink: ChildSpans, name: str, context: SpanContext,
                 parent: SpanContext | None,
                 kind: SpanKind, attributes: dict[str, Any]) -> None:
        self.start_time = time_ns()
        self.end_time: int | None = None
        self._sink, self.name, self.context, self.parent = sink, name, context, parent
        self.kind = kind
        self.attributes = attributes  # the caller's fresh dict (see `_frozen`)
        self.events: list[Event] = []
        self.status = _UNSET
        self._ended = False
        self._root: LightSpan | None = None
        self._held: list[LightSpan] = []

    def get_span_context(self) -> SpanContext:
        return self.context

    def add_event(self, name: str, attributes: Attributes = None,
                  timestamp: int | None = None) -> None:
        if not self._ended:
            self.events.append(Event(name, attributes, timestamp or time_ns()))

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if not self._ended:
            self.status = status if isinstance(status, Status) else Status(status, description)

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self.end_time = end_time or time_ns()
        self._sink.emit(self)

    @property
    def resource(self) -> Any:
        return self._sink._resource

    @property
    def instrumentation_scope(self) -> Any:
        return self._sink._scope

