"""File model of the Batch API (`batches:`): where files and batch state are kept, the
limits on an input file, and when batch lines may use dedicated capacity or must spill
to shared targets. Re-exported by `schema.py`."""

from __future__ import annotations

from pydantic import Field, field_validator

from policies.file_model import FileModel, PositiveFloat, PositiveInt, Target
from policies.store_schema import LimitStore


class BatchRoute(FileModel):
    """How batch lines asking for one route spill."""

    spill_to: list[Target] = []
    """Targets a spilled line tries first, in order (a batch-priced model: a backend model
    whose prices are the provider's batch prices). Each must also be a target of the route,
    so routing's compliance and capability filters apply to it; list it after the
    interactive targets with `objective: ordered` so interactive traffic does not pick it.
    Empty: the route's shared targets in routing's order."""


class Batches(FileModel):
    """The Batch API: `POST /v1/files`, `POST /v1/batches`. Lines run as the lowest
    priority band on dedicated capacity while it has room, and spill to shared targets
    only as a batch's completion window closes."""

    data_dir: str | None = None
    """Directory holding uploaded and produced files and the embedded SQLite state; none:
    the gateway's data directory (`ROUTEGATE_DATA_DIR`, default `~/.local/state/routegate`).
    With several replicas: a shared volume."""
    store: str = Field("sqlite", json_schema_extra={
        "pattern": r"^(sqlite$|rediss?://|unix://|redis\+(cluster|sentinel)://)"})
    """Where batch state lives: `sqlite` (a file in `data_dir`: this machine's processes)
    or a `redis://` URL every replica shares, so any replica answers and exactly one runs a
    batch at a time. Read at start-up."""
    max_file_bytes: PositiveInt = 200 * 1024 * 1024
    """The largest input file accepted (413 past it)."""
    max_lines: PositiveInt = 50_000
    """The most lines an input file may hold (400 naming the first line past it)."""
    max_line_bytes: PositiveInt = 1024 * 1024
    """The longest line an input file may hold (400 naming the line)."""
    lines_in_flight: PositiveInt = 8
    """Lines of one batch sent at once (dedicated and shared together)."""
    spare_queue_use: float = Field(0.5, ge=0, le=1)
    """A dedicated backend takes a batch line only while its gateway queue holds no
    waiter and its slots in use are below this share of `max_concurrency`."""
    background_slots: bool = True
    """A batch line on a dedicated backend whose scheduler hears the band (`priority:
    header` to a local_backend, or `vllm`) holds a background slot: it counts against
    `spare_queue_use` and other batch lines, never against an interactive request, which
    the backend runs first. Off (or `priority: none`): it holds one of `max_concurrency`'s
    slots like any request. A backend that ignores the band it is sent should say
    `priority: none`."""
    spare_kv_use: float = Field(0.8, ge=0, le=1)
    """A dedicated backend takes a batch line only while the KV-cache use it reports (its
    /metrics) is below this share, and it reports no request waiting."""
    spill_margin_s: PositiveFloat = 600.0
    """Lines spill to shared targets while the forecast finish at the local rate is later
    than the window's end minus this margin."""
    lease_s: PositiveFloat = 30.0
    """How long a replica holds a batch without renewing before another takes it over."""
    poll_interval_s: PositiveFloat = 1.0
    """How often a replica looks for batches that no one runs."""
    routes: dict[str, BatchRoute] = {}
    """Per route: where its batch lines spill."""

    @field_validator("store")
    @classmethod
    def _store_known(cls, store: str) -> str:
        if store == "sqlite":
            return store
        if store == "memory":
            raise ValueError("must be `sqlite` or a redis:// URL (batch state outlives a "
                             "process; `memory` is not offered)")
        return LimitStore._store_known(store)

