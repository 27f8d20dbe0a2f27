"""Where a request stands in a distributed trace: sampled or not, its ids, and the
`traceparent` each upstream attempt carries.

A request is sampled once, as it arrives, by the configured sampler's public
`should_sample` (the parent from an inbound W3C `traceparent`, as the SDK's tracer
would pass it); its spans are built only after it has finished, from its record.
"""

from __future__ import annotations

from collections.abc import Mapping
from random import getrandbits
from typing import Any

from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import SpanKind, TraceFlags, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.core.record import TraceIds

_PROPAGATOR = TraceContextTextMapPropagator()
_SAMPLED = int(TraceFlags.SAMPLED)


def inbound_trace_id(headers: Mapping[str, str]) -> str | None:
    """The caller's trace id (32 hex digits) from a valid `traceparent`, else None."""
    if "traceparent" not in headers:  # the usual case: skip the propagator
        return None
    context = get_current_span(_PROPAGATOR.extract(carrier=headers)).get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None


def new_span_id() -> int:
    """A random, valid (non-zero) span id for a span nobody outside has seen."""
    while True:
        span_id = getrandbits(64)
        if span_id:
            return span_id


class Sampling:
    """The sampler and the id generator of this gateway's traces."""

    __slots__ = ("ids", "sampler")

    def __init__(self, sampler: Sampler, ids: IdGenerator | None = None) -> None:
        self.sampler = sampler
        self.ids = ids or RandomIdGenerator()

    def start(self, name: str, headers: Mapping[str, str],
              attributes: dict[str, Any]) -> TraceIds:
        """Sample a request's root span named `name` with `attributes`."""
        parent_context = _PROPAGATOR.extract(carrier=headers) if "traceparent" in headers \
            else None
        parent = get_current_span(parent_context).get_span_context() \
            if parent_context is not None else None
        ids = self.ids
        if parent is not None and parent.is_valid:
            trace_id, parent_id, remote = parent.trace_id, parent.span_id, parent.is_remote
        else:
            trace_id, parent_id, remote = ids.generate_trace_id(), 0, False
        result = self.sampler.should_sample(parent_context, trace_id, name, SpanKind.SERVER,
                                            attributes, None)
        sampled = result.decision.is_sampled()
        state = tuple(result.trace_state.items()) if result.trace_state else ()
        added = tuple((k, v) for k, v in (result.attributes or {}).items()
                      if k not in attributes) if sampled else ()
        return TraceIds(trace_id=trace_id, span_id=ids.generate_span_id(), parent_id=parent_id,
                        parent_remote=remote, sampled=sampled,
                        flags=_SAMPLED if sampled else 0, trace_state=state,
                        root_attributes=added)
