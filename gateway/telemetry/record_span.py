"""A traced request's spans recorded as one plain record for the exporter process.

With the default OTLP/HTTP export the span processor is a `SpanPipe`
(`span_pipe.py`): encoding and HTTP happen in another process, and the request
path only records what cannot be deferred. The root is sampled exactly as the
SDK samples it (`ChildSpans.root`: inbound parent, the tracer's sampler and id
generator); a child keeps its name, kind, two clock readings, its attribute dict
and its events — no `SpanContext`, no span id. A child's id is made only when
someone asks for its context (the upstream CLIENT span, for `traceparent`); the
exporter process makes the others. When the root ends, the request becomes one
tuple (`span_records.py`) appended to the pipe's queue.
"""

from __future__ import annotations

from collections.abc import Callable
from time import time_ns
from typing import Any

from opentelemetry.trace import (
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
)
from opentelemetry.util.types import Attributes

from gateway.telemetry.light_span import SAMPLED, ChildSpans, PlainSpan
from gateway.telemetry.span_records import Record

# Enum members are read through `_value_` (the member's own attribute): `.value` goes
# through a Python-level descriptor, ~0.15 µs a read, several times a request.


class RecordSpans(ChildSpans):
    """`ChildSpans` whose spans end as records in a `SpanPipe` instead of `ReadableSpan`s.
    `for_tracer` returns None unless the tracer's provider has exactly that one pipe."""

    __slots__ = ("append", "scope_key")

    def __init__(self, append: Callable[[Record], None], scope_key: tuple[Any, ...],
                 new_span_id: Callable[[], int], tracer: Any) -> None:
        super().__init__(self._not_readable, getattr(tracer, "resource", None),
                         getattr(tracer, "_instrumentation_scope", None), new_span_id, tracer)
        self.append, self.scope_key = append, scope_key

    @staticmethod
    def _not_readable(span: Any) -> None:
        raise TypeError("a RecordSpans sink takes records, not ReadableSpans")

    @classmethod
    def for_tracer(cls, tracer: Tracer) -> RecordSpans | None:
        processor = getattr(tracer, "span_processor", None)
        inner = getattr(processor, "_span_processors", None)
        ids = getattr(tracer, "id_generator", None)
        scope = getattr(tracer, "_instrumentation_scope", None)
        if not isinstance(inner, tuple) or len(inner) != 1 or ids is None or scope is None:
            return None
        (pipe,) = inner
        if not getattr(pipe, "takes_records", False):
            return None
        return cls(pipe.append, (scope.name, scope.version, scope.schema_url),
                   ids.generate_span_id, tracer)

    def _recording_root(self, name: str, context: SpanContext, parent: SpanContext | None,
                        kind: SpanKind, attributes: dict[str, Any]) -> Span:
        return RecordedSpan(self, name, context, parent, kind._value_, attributes, None)

    def start(self, name: str, parent: SpanContext, kind: SpanKind,  # type: ignore[override]
              attributes: dict[str, Any], root: Span | None = None) -> RecordedSpan:
        return RecordedSpan(self, name, None, parent, kind._value_, attributes,
                            root if type(root) is RecordedSpan else None)

    def late(self, span: RecordedSpan) -> None:
        """A child ending after its root (or without one): a record of its own."""
        parent = span.parent
        assert parent is not None  # a child always has one
        self.append((self.scope_key, parent.trace_id, _state(parent), span.as_root(), ()))


def _state(context: SpanContext) -> dict[str, str] | None:
    state = context.trace_state
    return dict(state) if state else None


class RecordedSpan(PlainSpan):
    """A recording span kept as plain values until the request's record is made."""

    __slots__ = ("_context", "_ended", "_held", "_is_root", "_root", "_sink", "attributes",
                 "code",
                 "description", "end_time", "events", "kind", "name", "parent",
                 "start_time")

    def __init__(self, sink: RecordSpans, name: str, context: SpanContext | None,
                 parent: SpanContext | None, kind: int, attributes: dict[str, Any],
                 root: RecordedSpan | None) -> None:
        self.start_time = time_ns()
        self.end_time = 0
        self._sink, self.name, self._context, self.parent = sink, name, context, parent
        self.kind = kind
        self.attributes = attributes  # the caller's fresh dict, as on a `LightSpan`
        self.events: list[tuple[str, int, Any]] = []
        self.code: int = 0  # StatusCode.UNSET
        self.description: str | None = None
        self._ended = False
        self._is_root = context is not None  # a child's context is made when asked for
        self._root = root
        self._held: list[tuple[Any, ...]] = []  # a root's ended children, as tuples

    def get_span_context(self) -> SpanContext:
        context = self._context
        if context is None:  # a child whose id someone needs: made now, once
            parent = self.parent
            assert parent is not None
            context = self._context = SpanContext(
                parent.trace_id, self._sink._new_span_id(), False, SAMPLED,
                parent.trace_state)
        return context

    def add_event(self, name: str, attributes: Attributes = None,
                  timestamp: int | None = None) -> None:
        if not self._ended:
            self.events.append((name, timestamp or time_ns(),
                                dict(attributes) if attributes else None))

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
        if root is not None and not root._ended:  # the usual child: goes with its root
            context = self._context
            root._held.append((
                context.span_id if context is not None else 0, self.name, self.kind,
                self.start_time, self.end_time, self.attributes, self.events, self.code,
                self.description))
            return
        sink = self._sink
        if not self._is_root:  # a child ending after its root, or without one: alone
            sink.late(self)
            return
        context = self.get_span_context()
        sink.append((sink.scope_key, context.trace_id, _state(context), self.as_root(),
                     self._held))
        self._held = []

    def as_root(self) -> tuple[Any, ...]:
        """This span as a record's root (a child on its own: its parent is the root)."""
        context, parent = self._context, self.parent
        return (context.span_id if context is not None else 0,
                parent.span_id if parent is not None else 0,
                parent is not None and parent.is_remote, self.name, self.kind,
                self.start_time, self.end_time, self.attributes, self.events, self.code,
                self.description, (), 0)
