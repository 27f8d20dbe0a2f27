"""A request's priority band: the `x-routegate-priority` header (a gateway sends its
tenant's band there) or, as vLLM takes it, the body's `priority` field. Lower runs first;
the header wins when both are present, since the gateway's word is the tenant's band."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from local_backend.server.errors import bad_request

PRIORITY_HEADER = "x-routegate-priority"
DEFAULT_PRIORITY = 1  # the gateway's `normal` band (high 0, low 2, batch lines 3)
MAX_PRIORITY = 9  # bands are labels of the engine's metrics: a small fixed set


def priority_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> int:
    value: Any = headers.get(PRIORITY_HEADER)
    name = PRIORITY_HEADER
    if value is not None:
        value = int(value) if value.strip().isdigit() else None
    else:
        value, name = body.get("priority", DEFAULT_PRIORITY), "priority"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        raise bad_request(f"{name} must be an integer band from 0 (first) to {MAX_PRIORITY}",
                          name)
    return value
