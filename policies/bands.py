"""A caller's priority, and the integer band a backend's own scheduler takes for it.

The gateway queues by the tenant's `priority`; a dedicated backend that schedules by
priority itself (local_backend, vLLM with `--scheduling-policy priority`) gets it as a
band, lower first, so its queue and the gateway's agree on who goes first.
"""

from __future__ import annotations

from typing import Literal

Priority = Literal["high", "normal", "low"]
PRIORITY_BANDS: dict[Priority, int] = {"high": 0, "normal": 1, "low": 2}
# How the band reaches a backend: a header, vLLM's body field, or not at all.
BandCarrier = Literal["header", "vllm", "none"]
