"""A traced request recorded as one plain record for the exporter process.

With the default OTLP/HTTP export the span processor is a `SpanPipe`
(`span_pipe.py`): encoding and HTTP happen in another process, and the request
path only records what cannot be deferred. A `RecordedTrace` is the request's
trace and its root at once: the root is sampled as `Tracer.start_span` samples it
(the inbound parent, the tracer's sampler — its decision, attributes and trace
state — and id generator), but kept as a few ints, not a span object. A child
(`RecordedSpan`) keeps its name, kind, two clock readings, its attribute dict and
its events; its id is made only when someone asks for it (the upstream CLIENT
span, for `traceparent`), the exporter process makes the others. The root's own
attributes leave as the request's facts (`span_facts.py`), made into attributes
by the exporter process. When the root ends, the request becomes one tuple
(`span_records.py`) appended to the pipe's queue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from time import time_ns
from typing import Any

from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    INVALID_SPAN,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
    get_current_span,
)
from opentelemetry.util.types import Attributes

from gateway.telemetry.light_span import SAMPLED, PlainSpan
from gateway.telemetry.span_facts import Facts, attributes_from, note_status
from gateway.telemetry.span_records import Record
from gateway.telemetry.spans import (
    UNRECORDED_STEP,
    RequestTrace,
    Step,
    add_known,
    clean,
    extract_parent,
    mark_error,
)

# Enum members are read through `_value_` (the member's own attribute): `.value` goes
# through a Python-level descriptor, read several times a request.
_SERVER, _INTERNAL, _CLIENT = 1, 0, 2  # SpanKind values
_ERROR = StatusCode.ERROR._value_


class RecordSpans:
    """What a `RecordedTrace` needs from the SDK tracer: the pipe's `append`, the scope,
    the sampler and the id generator. `for_tracer` returns None unless the tracer's
    provider has exactly that one pipe."""

    __slots__ = ("_enabled", "_ids", "_root_sampler", "_sampler", "append", "scope_key")

    def __init__(self, append: Callable[[Record], None], scope_key: tuple[Any, ...],
                 tracer: Any) -> None:
        self.append, self.scope_key = append, scope_key
        self._sampler: Sampler = tracer.sampler
        self._ids = tracer.id_generator
        self._enabled: Callable[[], bool] | None = getattr(tracer, "_is_enabled", None)
        # A new trace (no inbound parent) under the SDK's own samplers is decided here,
        # as they decide it, without a `SamplingResult`; any other sampler is asked.
        root = self._sampler
        if type(root) is ParentBased:
            root = root._root
        self._root_sampler = root if type(root) in (StaticSampler, TraceIdRatioBased) else None

    @classmethod
    def for_tracer(cls, tracer: Tracer) -> RecordSpans | None:
        processor = getattr(tracer, "span_processor", None)
        inner = getattr(processor, "_span_processors", None)
        scope = getattr(tracer, "_instrumentation_scope", None)
        if (not isinstance(inner, tuple) or len(inner) != 1 or scope is None
                or getattr(tracer, "id_generator", None) is None
                or getattr(tracer, "sampler", None) is None):
            return None
        (pipe,) = inner
        if not getattr(pipe, "takes_records", False):
            return None
        return cls(pipe.append, (scope.name, scope.version, scope.schema_url), tracer)

    def trace(self, name: str, headers: Mapping[str, str],
              attributes: dict[str, Any]) -> RecordedTrace | RequestTrace:
        """A request's trace, its root named `name` with `attributes` (a fresh dict)."""
        enabled = self._enabled
        if enabled is not None and not enabled():  # the SDK's tracer gives INVALID_SPAN
            return RequestTrace.untraced(headers)
        inbound = extract_parent(headers)
        ids = self._ids
        sampler = self._root_sampler
        parent = get_current_span(inbound).get_span_context() if inbound else None
        state: TraceState | None = None
        if parent is not None and parent.is_valid:
            trace_id, random_id = parent.trace_id, parent.trace_flags.random_trace_id
            sampler = None  # a parent-based decision: the sampler's own code
        else:
            parent = None
            trace_id, random_id = ids.generate_trace_id(), ids.is_trace_id_random()
        if type(sampler) is StaticSampler:
            recording = sampled = sampler._decision is Decision.RECORD_AND_SAMPLE
        elif type(sampler) is TraceIdRatioBased:
            recording = sampled = trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < sampler.bound
        else:
            result = self._sampler.should_sample(inbound, trace_id, name, SpanKind.SERVER,
                                                 attributes, ())
            recording, sampled = result.decision.is_recording(), result.decision.is_sampled()
            state = result.trace_state
            if recording:
                attributes = dict(result.attributes or {})
        flags = TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        return RecordedTrace(self, name, trace_id, ids.generate_span_id(), flags, state,
                             parent, attributes, recording)


class RecordedTrace:
    """One request's trace, recorded as plain values (see the module docstring); the
    same calls as `RequestTrace`."""

    __slots__ = ("_attributes", "_ended", "_flags", "_held", "_name", "_parent", "_sink",
                 "_span_id", "_start", "_state", "_trace_id", "recording")

    def __init__(self, sink: RecordSpans, name: str, trace_id: int, span_id: int, flags: int,
                 state: TraceState | None, parent: SpanContext | None,
                 attributes: dict[str, Any], recording: bool) -> None:
        self._start = time_ns()
        self._sink, self._name = sink, name
        self._trace_id, self._span_id, self._flags = trace_id, span_id, flags
        self._state, self._parent = state, parent
        self._attributes = attributes
        self.recording = recording
        self._ended = False
        self._held: list[tuple[Any, ...]] = []  # ended children, as tuples

    @property
    def trace_id(self) -> str:
        return f"{self._trace_id:032x}"

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Attributes for the root span (None values are left out)."""
        if self.recording and not self._ended:
            add_known(self._attributes, attributes)

    def start(self, name: str, attributes: Mapping[str, Any] | None = None) -> Span:
        """A child of the root (INTERNAL); the caller ends it."""
        if not self.recording:
            return INVALID_SPAN
        return RecordedSpan(self, name, _INTERNAL, clean(attributes) if attributes else {})

    def step(self, name: str,
             attributes: Mapping[str, Any] | None = None) -> RecordedSpan | Step:
        """A child span around one pipeline step (itself the context manager)."""
        if not self.recording:
            return UNRECORDED_STEP
        return RecordedSpan(self, name, _INTERNAL, clean(attributes) if attributes else {})

    def start_upstream(self, name: str, attributes: Mapping[str, Any] | None = None,
                       facts: Facts | None = None) -> Span:
        """The CLIENT span of one upstream attempt, with its `facts` (`span_facts.py`)."""
        if not self.recording:
            return INVALID_SPAN
        span = RecordedSpan(self, name, _CLIENT, clean(attributes) if attributes else {})
        span.facts = facts
        return span

    def inject(self, span: Span, headers: MutableMapping[str, str]) -> None:
        """`traceparent` (and `tracestate`) for `span`, as the W3C propagator writes
        them; an unrecorded request's is its root's (flagged not sampled)."""
        if type(span) is RecordedSpan:
            span_id, flags = span.span_id(), 1
        else:
            span_id, flags = self._span_id, self._flags
        headers["traceparent"] = f"00-{self._trace_id:032x}-{span_id:016x}-{flags:02x}"
        if self._state:
            headers["tracestate"] = self._state.to_header()

    def end(self, status_code: int, error_type: str | None = None) -> None:
        self._record(None, status_code, error_type)

    def close(self, facts: Facts, status_code: int, error_type: str | None = None) -> None:
        """End the root with the request's facts, made into attributes by the exporter."""
        self._record(facts, status_code, error_type)

    def _record(self, facts: Facts | None, status_code: int, error_type: str | None) -> None:
        if self._ended or not self.recording:
            return
        self._ended = True
        attributes = self._attributes
        code = _ERROR if note_status(attributes, status_code, error_type) else 0
        parent = self._parent
        sink = self._sink
        sink.append((sink.scope_key, self._trace_id, _state(self._state), (
            self._span_id, parent.span_id if parent is not None else 0,
            parent is not None and parent.is_remote, self._name, _SERVER, self._start,
            time_ns(), attributes if facts is None else (attributes, facts), (), code,
            None, (), 0), self._held))
        self._held = []

    def late(self, span: RecordedSpan) -> None:
        """A child ending after its root: a record of its own."""
        sink = self._sink
        sink.append((sink.scope_key, self._trace_id, _state(self._state), (
            span._span_id, self._span_id, False, span.name, span.kind, span.start_time,
            span.end_time, span.attributes_or_facts(), span.events, span.code,
            span.description, (), 0),
            ()))


def give_facts(span: Span, facts: Facts) -> None:
    """`facts` (`span_facts.py`) for a recording `span`: kept as they are by a
    `RecordedSpan` (the exporter process makes its attributes), else its attributes."""
    if type(span) is RecordedSpan:
        span.facts = facts
    elif span.is_recording():
        span.set_attributes(attributes_from(facts))


def _state(state: TraceState | None) -> dict[str, str] | None:
    return dict(state) if state else None


class RecordedSpan(PlainSpan):
    """A child of a `RecordedTrace`, kept as plain values until the request's record."""

    __slots__ = ("_ended", "_root", "_span_id", "attributes", "code", "description",
                 "end_time", "events", "facts", "kind", "name", "start_time")

    def __init__(self, root: RecordedTrace, name: str, kind: int,
                 attributes: dict[str, Any]) -> None:
        self.start_time = time_ns()
        self.end_time = 0
        self._root, self.name, self.kind = root, name, kind
        self.attributes = attributes  # the caller's fresh dict, as on a `LightSpan`
        self.events: tuple[tuple[str, int, Any], ...] = ()  # rare: no list for none
        self.code: int = 0  # StatusCode.UNSET
        self.description: str | None = None
        self._ended = False
        self._span_id = 0  # made when someone needs it (`span_id`)
        self.facts: Facts | None = None  # attributes the exporter process makes

    def attributes_or_facts(self) -> Any:
        """What a record holds as this span's attributes (see `span_records.py`)."""
        facts = self.facts
        return self.attributes if facts is None else (self.attributes, facts)

    def __enter__(self) -> RecordedSpan:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        if exc is not None:
            mark_error(self, exc)
        self.end()

    def span_id(self) -> int:
        span_id = self._span_id
        if not span_id:
            span_id = self._span_id = self._root._sink._ids.generate_span_id()
        return span_id

    def get_span_context(self) -> SpanContext:
        root = self._root
        return SpanContext(root._trace_id, self.span_id(), False, SAMPLED, root._state)

    def add_event(self, name: str, attributes: Attributes = None,
                  timestamp: int | None = None) -> None:
        if not self._ended:
            self.events += ((name, timestamp or time_ns(),
                             dict(attributes) if attributes else None),)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if not self._ended:
            if isinstance(status, Status):
                self.code, self.description = status.status_code._value_, status.description
            else:
                self.code = status._value_
                self.description = description if status is StatusCode.ERROR else None

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self.end_time = end_time or time_ns()
        root = self._root
        if root._ended:
            root.late(self)
            return
        root._held.append((self._span_id, self.name, self.kind, self.start_time,
                           self.end_time, self.attributes_or_facts(), self.events,
                           self.code, self.description))
