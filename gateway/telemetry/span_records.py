"""Finished spans as plain values: what the gateway hands to the exporter process.

One record is one request's spans (or one span ending on its own), as tuples of
ints, strings, floats, dicts and lists only, so a batch of records marshals fast
and loads without importing anything:

    record = (scope, trace_id, trace_state, root, children)
    scope  = (name, version, schema_url)             # the instrumentation scope
    trace_state = {key: value} | None
    root   = (span_id, parent_id, parent_remote, name, kind, start_ns, end_ns,
              attributes, events, status_code, status_description, links, dropped)
    child  = (span_id, name, kind, start_ns, end_ns, attributes, events,
              status_code, status_description)       # parent: the root
    event  = (name, timestamp_ns, attributes | None)
    link   = (trace_id, span_id, is_remote, attributes | None)

A span of the request path (`record_span.py`) may leave its attributes as a pair
`(attributes, facts)`: the few it was given, and a facts tuple (`span_facts.py`:
the request's, the routing decision's, an upstream attempt's), which `expanded`
makes into the rest in the exporter process.

`parent_id` 0 means no parent; a `span_id` of 0 means nobody outside the gateway
has seen the span's id (only the upstream CLIENT span's goes out, in
`traceparent`), so the exporter process makes one. `kind` is `SpanKind.value`,
`status_code` is `StatusCode.value`.

`spans_of` (in the exporter process) turns records into objects the OTLP encoder
reads exactly like the SDK's `ReadableSpan`s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from gateway.telemetry.span_facts import attributes_from

Record = tuple[Any, ...]
ROOT = 3  # the root's index in a record
ROOT_ATTRIBUTES = 7  # the attributes' index in a root
CHILD_ATTRIBUTES = 5  # and in a child
CHILDREN = 4


class _Kind(NamedTuple):
    value: int


class _Code(NamedTuple):
    value: int


class _Status(NamedTuple):
    status_code: _Code
    description: str | None


class _Context(NamedTuple):
    trace_id: int
    span_id: int
    is_remote: bool
    trace_state: dict[str, str] | None


class _Event(NamedTuple):
    name: str
    timestamp: int
    attributes: dict[str, Any] | None


class _Link(NamedTuple):
    context: _Context
    attributes: dict[str, Any] | None


_KINDS = tuple(_Kind(value) for value in range(5))  # SpanKind: INTERNAL … CONSUMER
_STATUSES = tuple(_Status(_Code(value), None) for value in range(3))  # UNSET, OK, ERROR


class Resource:
    """The gateway's resource, as the encoder reads it (identity-hashed: one per process)."""

    __slots__ = ("attributes", "schema_url")

    def __init__(self, attributes: dict[str, Any], schema_url: str = "") -> None:
        self.attributes, self.schema_url = attributes, schema_url


class Scope:
    """An instrumentation scope, as the encoder reads it."""

    __slots__ = ("attributes", "name", "schema_url", "version")

    def __init__(self, name: str, version: str | None, schema_url: str | None) -> None:
        self.name, self.version, self.schema_url = name, version, schema_url
        self.attributes: dict[str, Any] | None = None


class Span:
    """One span rebuilt from a record: the attributes `OtlpEncoder` reads of a span."""

    __slots__ = ("attributes", "context", "dropped_attributes", "end_time", "events",
                 "instrumentation_scope", "kind", "links", "name", "parent", "resource",
                 "start_time", "status")

    def __init__(self, context: _Context, parent: _Context | None, name: str, kind: int,
                 start: int, end: int, attributes: dict[str, Any], events: list[Any],
                 code: int, description: str | None, resource: Resource, scope: Scope,
                 links: tuple[_Link, ...] = (), dropped: int = 0) -> None:
        self.context, self.parent, self.name = context, parent, name
        self.kind = _KINDS[kind]
        self.start_time, self.end_time, self.attributes = start, end, attributes
        self.events = [_Event(*event) for event in events] if events else ()
        self.status = _Status(_Code(code), description) if description else _STATUSES[code]
        self.resource, self.instrumentation_scope = resource, scope
        self.links, self.dropped_attributes = links, dropped

    def get_span_context(self) -> _Context:
        return self.context


class SpansOf:
    """Records → `Span`s for one exporter process (its resource, its scopes, its ids)."""

    def __init__(self, resource: Resource, new_span_id: Callable[[], int]) -> None:
        self._resource, self._new_id = resource, new_span_id
        self._scopes: dict[tuple[Any, ...], Scope] = {}

    def __call__(self, records: Iterable[Record]) -> list[Span]:
        out: list[Span] = []
        resource, new_id, scopes = self._resource, self._new_id, self._scopes
        for record in records:
            scope_key, trace_id, state, root, children = expanded(record)
            scope = scopes.get(scope_key)
            if scope is None:
                scope = scopes[scope_key] = Scope(*scope_key)
            (span_id, parent_id, remote, name, kind, start, end, attributes, events, code,
             description, links, dropped) = root
            context = _Context(trace_id, span_id or new_id(), False, state)
            parent = _Context(trace_id, parent_id, remote, state) if parent_id else None
            mine = _Context(trace_id, context.span_id, False, state)  # the children's parent
            for (child_id, child_name, child_kind, child_start, child_end, child_attributes,
                 child_events, child_code, child_description) in children:
                out.append(Span(
                    _Context(trace_id, child_id or new_id(), False, state), mine, child_name,
                    child_kind, child_start, child_end, child_attributes, child_events,
                    child_code, child_description, resource, scope))
            out.append(Span(context, parent, name, kind, start, end, attributes, events, code,
                            description, resource, scope,
                            tuple(_Link(_Context(t, s, r, None), a) for t, s, r, a in links)
                            if links else (), dropped))
        return out


def expanded(record: Record) -> Record:
    """`record` with its spans' facts made into attributes (itself when it has none)."""
    root, children = record[ROOT], record[CHILDREN]
    root_facts = type(root[ROOT_ATTRIBUTES]) is tuple
    children_facts = any(type(child[CHILD_ATTRIBUTES]) is tuple for child in children)
    if not root_facts and not children_facts:
        return record
    if root_facts:
        root = (*root[:ROOT_ATTRIBUTES], _attributes(root[ROOT_ATTRIBUTES]),
                *root[ROOT_ATTRIBUTES + 1:])
    if children_facts:
        children = [(*child[:CHILD_ATTRIBUTES], _attributes(child[CHILD_ATTRIBUTES]),
                     *child[CHILD_ATTRIBUTES + 1:])
                    if type(child[CHILD_ATTRIBUTES]) is tuple else child
                    for child in children]
    return (*record[:ROOT], root, children)


def _attributes(given_and_facts: tuple[dict[str, Any], Any]) -> dict[str, Any]:
    given, facts = given_and_facts
    return {**given, **attributes_from(facts)}


def record_of(span: Any, scope: tuple[Any, ...]) -> Record:
    """A record of any finished span read like the SDK's `ReadableSpan` (a span that did
    not come through the gateway's request path: another tracer on the same provider)."""
    context, parent = span.context, span.parent
    state = dict(context.trace_state) if context.trace_state else None
    status = span.status
    root = (context.span_id, parent.span_id if parent is not None else 0,
            bool(parent is not None and parent.is_remote), span.name, span.kind.value,
            span.start_time or 0, span.end_time or 0, dict(span.attributes or {}),
            [(e.name, e.timestamp, dict(e.attributes) if e.attributes else None)
             for e in span.events],
            status.status_code.value, status.description,
            tuple((link.context.trace_id, link.context.span_id, link.context.is_remote,
                   dict(link.attributes) if link.attributes else None)
                  for link in span.links),
            span.dropped_attributes)
    return (scope, context.trace_id, state, root, ())
