"""The priority bands, and the integer band a backend's own scheduler takes for each.

The gateway queues by band; a dedicated backend that schedules by priority itself
(local_backend, vLLM with `--scheduling-policy priority`) gets it as an integer, lower
first, so its queue and the gateway's agree on who goes first. A tenant's `priority` is
one of the first three; `batch`, below them all, is the Batch API's own: its lines are
queued last, shed first and preempted first, and no tenant can be given it.
"""

from __future__ import annotations

from typing import Literal

Priority = Literal["high", "normal", "low", "batch"]
TenantPriority = Literal["high", "normal", "low"]  # what a policy may give a tenant
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low", "batch")  # served in this order
TENANT_PRIORITIES: tuple[TenantPriority, ...] = ("high", "normal", "low")
PRIORITY_BANDS: dict[Priority, int] = {"high": 0, "normal": 1, "low": 2, "batch": 3}
BATCH_BAND: Priority = "batch"  # every batch line's, whatever its tenant's priority
# How the band reaches a backend: a header, vLLM's body field, or not at all.
BandCarrier = Literal["header", "vllm", "none"]
