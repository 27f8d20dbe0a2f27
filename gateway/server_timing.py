"""Per-request time bookkeeping behind the `Server-Timing` header.

The implementation lives with the rest of telemetry (`gateway/telemetry/timing.py`):
the same object feeds the header, the final SSE comment, the spans, the metrics and
the access log, so they can never disagree. `ServerTiming` keeps the pipeline's name.
"""

from __future__ import annotations

from gateway.telemetry.timing import RequestTimings as ServerTiming

__all__ = ["ServerTiming"]
