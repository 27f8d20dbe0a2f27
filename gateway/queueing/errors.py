"""Why a request did not get (or lost its place for) a backend slot.

`QueueRejected` and its subclasses are raised *before* anything is sent
upstream, so the caller may try routing's next candidate; when no candidate
admits the request it becomes a 503 with `Retry-After`. `QueueDeadlinePassed`
is final: the request's time budget ran out while it waited (504).

These are plain exceptions so the queue can be used and tested without the
HTTP layer; the gateway translates them into its `GatewayError` types.
"""

from __future__ import annotations

import math


class QueueRejected(Exception):
    """Not admitted to (or evicted from) a backend's queue; try another backend."""

    reason = "rejected"

    def __init__(self, key: str, message: str, *, retry_after_s: float) -> None:
        self.key = key
        # Whole seconds, at least one: the unit of the HTTP `Retry-After` header.
        self.retry_after_s = max(1, math.ceil(retry_after_s))
        super().__init__(message)


class QueueFull(QueueRejected):
    """The queue (or the share of it this priority may use) is full."""

    reason = "queue_full"


class WouldMissDeadline(QueueRejected):
    """The predicted wait alone would break the request's remaining budget."""

    reason = "predicted_wait_exceeds_budget"

    def __init__(self, key: str, message: str, *, retry_after_s: float,
                 predicted_wait_s: float) -> None:
        self.predicted_wait_s = predicted_wait_s
        super().__init__(key, message, retry_after_s=retry_after_s)


class Evicted(QueueRejected):
    """A waiter pushed out of a full queue by a higher-priority arrival."""

    reason = "shed_for_higher_priority"


class QueueDeadlinePassed(Exception):
    """The request's deadline passed while it waited for a slot (504)."""

    def __init__(self, key: str, waited_s: float) -> None:
        self.key = key
        self.waited_s = waited_s
        super().__init__(
            f"the request waited {waited_s:.2f} s in the queue for {key!r} "
            "and its deadline passed before a slot was free"
        )
