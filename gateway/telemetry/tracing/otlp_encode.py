"""OTLP trace export requests written straight to protobuf wire bytes.

The OTLP exporter's own encoder builds a protobuf message per span, per attribute
and per value, and hashes the resource of every span to group them: ~28 µs a
span for the gateway's spans, on the core that serves requests (the batch thread
shares the GIL). This writes the same `ExportTraceServiceRequest` bytes directly
(tested by decoding them with `opentelemetry-proto`), remembering the encoded
form of attribute pairs that repeat from request to request (method, route,
backend, model, tenant, …), the head of each timing attribute, span names and kinds,
the resource and the instrumentation scope; what a request's spans share (trace id,
the children's parent id) is written once for the run of spans that share it.

Field numbers are those of opentelemetry/proto/trace/v1/trace.proto and
common/v1/common.proto.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.telemetry.tracing.span_build import SpanData

_FIXED64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack
_FIXED32 = struct.Struct("<I").pack
_FLAGS_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_IS_REMOTE = 0x200
_CACHED_PAIRS_MAX = 4096
_TIMES = struct.Struct("<BQBQ").pack  # start_time_unix_nano, end_time_unix_nano (fixed64)
# Span.status without a description, by code (UNSET, OK, ERROR); Span.flags (field 16).
_STATUS = (b"\x7a\x00", b"\x7a\x02\x18\x01", b"\x7a\x02\x18\x02")
_REMOTE_PARENT = b"\x85\x01" + _FIXED32(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)
_LOCAL = b"\x85\x01" + _FIXED32(_FLAGS_HAS_IS_REMOTE)
_CACHED_STRING_MAX_CHARS = 128


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return bytes((value,))
    value &= (1 << 64) - 1  # int64: negatives as ten-byte two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    size = len(payload)
    return tag + (bytes((size,)) if size < 0x80 else _varint(size)) + payload


def _any_value(value: Any) -> bytes:
    """An AnyValue message's bytes."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), v))
                                        for k, v in value.items()))
    return b""  # None, or a type OTLP cannot carry: an empty AnyValue


def _key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))


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


class EncodedBatch:
    """Spans encoded so far for one export request, by scope (`OtlpEncoder.add_spans`)."""

    __slots__ = ("by_scope", "spans")

    def __init__(self) -> None:
        self.by_scope: dict[Any, tuple[Any, list[bytes]]] = {}
        self.spans = 0


class OtlpEncoder:
    """One per exporter (its caches are not shared; the batch thread is its only user)."""

    def __init__(self) -> None:
        self._last_trace = self._last_parent = -1
        self._last_trace_field = self._last_parent_field = b""
        self._names: dict[tuple[str, Any], bytes] = {}  # (name, kind) → name and kind fields
        self._pairs: dict[tuple[bytes, str, type, Any], bytes] = {}
        self._keys: dict[str, bytes] = {}  # key → KeyValue.key field
        self._doubles: dict[tuple[bytes, str], bytes] = {}  # a double pair's field head
        self._resources: dict[Any, bytes] = {}
        self._scopes: dict[Any, bytes] = {}

    def add_spans(self, batch: EncodedBatch, trace_id: int,
                  trace_state: Mapping[str, str] | None, spans: Sequence[SpanData],
                  scope: Scope) -> None:
        """Encode one request's spans (`span_build.spans_of`) into `batch`."""
        entry = batch.by_scope.get(scope)
        if entry is None:
            entry = batch.by_scope[scope] = (scope, [])
        encoded, fields = entry[1], self._fields
        for span in spans:
            encoded.append(fields(trace_id, span.span_id, trace_state, span.parent_id,
                                  span.parent_remote, span.name, span.kind, span.start_ns,
                                  span.end_ns, span.attributes, span.events, span.code,
                                  span.description))
        batch.spans += len(spans)

    def request_of(self, batch: EncodedBatch, resource: Any) -> bytes:
        """The ExportTraceServiceRequest bytes of what `batch` holds."""
        return self._resource_spans(resource, batch.by_scope.values())

    def _resource_spans(self, resource: Any,
                        by_scope: Iterable[tuple[Any, list[bytes]]]) -> bytes:
        """ExportTraceServiceRequest.resource_spans (field 1) for one resource."""
        scope_spans = b"".join(
            _field(b"\x12", self._scope(scope) + b"".join(encoded)
                   + (_field(b"\x1a", scope.schema_url.encode())
                      if scope is not None and scope.schema_url else b""))
            for scope, encoded in by_scope)
        schema = getattr(resource, "schema_url", "") or ""
        body = self._resource(resource) + scope_spans + (
            _field(b"\x1a", schema.encode()) if schema else b"")
        return _field(b"\x0a", body)

    def _fields(self, trace_id: int, span_id: int, trace_state: Mapping[str, str] | None,
                parent_id: int, parent_remote: bool, name: str, kind: int, start: int,
                end: int, attributes: Mapping[str, Any] | None,
                events: Sequence[tuple[str, int, Any]], code: int,
                description: str | None) -> bytes:
        """ScopeSpans.spans (field 2) for one span (`parent_id` 0: none). What a request's
        spans share is encoded once: the trace id of the span before, the parent id of
        the span before (children of one root), the name and kind, the status and flags
        of common spans."""
        if trace_id != self._last_trace:
            self._last_trace = trace_id
            self._last_trace_field = b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08"
        parts = [self._last_trace_field, span_id.to_bytes(8, "big")]
        if trace_state:
            parts.append(_field(b"\x1a", ",".join(
                f"{k}={v}" for k, v in trace_state.items()).encode()))
        if parent_id:
            if parent_id != self._last_parent:
                self._last_parent = parent_id
                self._last_parent_field = b"\x22\x08" + parent_id.to_bytes(8, "big")
            parts.append(self._last_parent_field)
        named = self._names.get((name, kind))
        if named is None:
            if len(self._names) >= _CACHED_PAIRS_MAX:
                self._names.clear()
            named = self._names[(name, kind)] = (
                _field(b"\x2a", name.encode()) + b"\x30" + _varint(kind + 1))
        parts += (named, _TIMES(0x39, start, 0x41, end))
        if attributes:
            parts.append(self._attributes(b"\x4a", attributes))
        for event_name, timestamp, event_attributes in events:
            body = b"\x09" + _FIXED64(timestamp) + _field(b"\x12", event_name.encode())
            if event_attributes:
                body += self._attributes(b"\x1a", event_attributes)
            parts.append(_field(b"\x5a", body))
        if description:
            parts.append(_field(b"\x7a", _field(b"\x12", description.encode())
                                + (b"\x18" + _varint(code) if code else b"")))
        else:
            parts.append(_STATUS[code])
        parts.append(_REMOTE_PARENT if parent_id and parent_remote else _LOCAL)
        return _field(b"\x12", b"".join(parts))

    def _attributes(self, tag: bytes, attributes: Mapping[str, Any]) -> bytes:
        pairs, keys, doubles = self._pairs, self._keys, self._doubles
        out = []
        for key, value in attributes.items():
            kind = type(value)
            if (kind is str and len(value) <= _CACHED_STRING_MAX_CHARS) or kind is bool:
                cached = pairs.get((tag, key, kind, value))
                if cached is None:
                    if len(pairs) >= _CACHED_PAIRS_MAX:
                        pairs.clear()
                    cached = pairs[(tag, key, kind, value)] = _field(tag, _key_value(key, value))
                out.append(cached)
                continue
            if kind is float:  # the timings: the whole field but the 8 bytes of the double
                head = doubles.get((tag, key))
                if head is None:
                    if len(doubles) >= _CACHED_PAIRS_MAX:
                        doubles.clear()
                    head = doubles[(tag, key)] = _field(
                        tag, _field(b"\x0a", key.encode()) + b"\x12\x09\x21" + bytes(8))[:-8]
                out += (head, _DOUBLE(value))
                continue
            prefix = keys.get(key)
            if prefix is None:
                if len(keys) >= _CACHED_PAIRS_MAX:
                    keys.clear()
                prefix = keys[key] = _field(b"\x0a", key.encode())
            out.append(_field(tag, prefix + _field(b"\x12", _any_value(value))))
        return b"".join(out)

    def _resource(self, resource: Any) -> bytes:
        """ResourceSpans.resource (field 1), encoded once per resource."""
        if resource is None:
            return b""
        encoded = self._resources.get(resource)
        if encoded is None:
            attributes = resource.attributes
            body = b"".join(_field(b"\x0a", _key_value(k, v)) for k, v in attributes.items())
            encoded = self._resources[resource] = _field(b"\x0a", body)
        return encoded

    def _scope(self, scope: Any) -> bytes:
        """ScopeSpans.scope (field 1), encoded once per scope."""
        if scope is None:
            return b""
        encoded = self._scopes.get(scope)
        if encoded is None:
            body = _field(b"\x0a", scope.name.encode())
            if scope.version:
                body += _field(b"\x12", scope.version.encode())
            for key, value in (scope.attributes or {}).items():
                body += _field(b"\x1a", _key_value(key, value))
            encoded = self._scopes[scope] = _field(b"\x0a", body)
        return encoded
