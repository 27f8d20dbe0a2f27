"""File models of resilience: health checks per backend, outlier ejection and retries."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from policies.file_model import FileModel, PositiveFloat, PositiveInt


class HealthCheck(FileModel):
    """Active health checks: a GET every `interval_s`; `unhealthy_threshold` failures in a
    row take the backend's targets out of routing, `healthy_threshold` passes in a row put
    them back."""

    enabled: bool | None = None
    """On or off; unset: on for dedicated backends, off for shared (paid-per-token) APIs."""
    path: str | None = Field(None, pattern=r"^/")
    """Path on the URL's host; unset: `/health` for a dedicated backend (local_backend, vLLM,
    TGI), `<url>/models` for a shared API."""
    interval_s: PositiveFloat = 5.0
    """Seconds between two checks."""
    timeout_s: PositiveFloat = 2.0
    """A check that takes longer fails."""
    healthy_threshold: PositiveInt = 2
    """Passes in a row that bring an unhealthy backend back."""
    unhealthy_threshold: PositiveInt = 3
    """Failures in a row that take the backend out of routing."""


class OutlierDetection(FileModel):
    """Envoy-style ejection of a failing target (`backend/model`), in each gateway process:
    after `consecutive_failures` connect errors, timeouts or 5xx in a row it gets no
    requests for `base_ejection_s` (the n-th ejection in a row: n times that, at most
    `max_ejection_s`), then one request probes it: a success puts it back, a failure
    ejects it again."""

    enabled: bool = True
    """Off: failing targets keep their share of requests."""
    consecutive_failures: PositiveInt = 5
    """Connect errors, timeouts and 5xx in a row that eject a target."""
    base_ejection_s: PositiveFloat = 30.0
    """How long the first ejection lasts; the n-th in a row lasts n times this."""
    max_ejection_s: PositiveFloat = 300.0
    """The longest ejection; a target in service this long starts counting from one again."""
    max_ejection_percent: Annotated[float, Field(ge=0, le=100)] = 50.0
    """Share of a route's targets that may be out at once (at least one, never all of them)."""


class Retries(FileModel):
    """Retries of the same target after a failure that says "try again": a connect error,
    503, 529, or 429 with `Retry-After`; only while the request's deadline leaves room, and
    within a per-process budget, so a failing backend never meets a retry storm."""

    max_per_target: Annotated[int, Field(ge=0)] = 0
    """Retries of one target per request; 0: a failure moves on to the next candidate at once,
    as a route with fallbacks usually wants."""
    backoff_base_ms: PositiveFloat = 50.0
    """The n-th retry waits a random time up to this × 2^(n-1) (full jitter)."""
    backoff_max_ms: PositiveFloat = 2000.0
    """No wait is longer; a `Retry-After` asking for longer means no retry."""
    budget_percent: Annotated[float, Field(ge=0, le=100)] = 20.0
    """Retries at most this share of the requests of the last `budget_window_s`."""
    budget_window_s: PositiveFloat = 10.0
    """The sliding window of the retry budget, in seconds."""
    min_per_window: Annotated[int, Field(ge=0)] = 3
    """Retries the budget always allows in a window, so a quiet gateway can still retry."""


class Resilience(FileModel):
    outlier_detection: OutlierDetection = OutlierDetection()
    """Taking targets that fail in a row out of routing for a while."""
    retries: Retries = Retries()
    """Retrying the same target after a failure that says "try again"."""
