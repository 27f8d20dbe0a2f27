"""How a plug-in joins the gateway: given `Wiring` once at start-up, it says what it `Provides`.

`gateway.app.PLUGINS` lists the plug-ins in order, one line each; that order is the
order observers are told about a request, and `assemble` fixes the pipeline's `Hooks`
from what they provide (frozen afterwards, as aiohttp freezes its signals). Adding a
plug-in is one module with an `install(wiring) -> Provides` and one line in that list;
plug-ins do not import one another: what two of them share (the live statistics, the
token counter) comes in the wiring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from aiohttp import web

from gateway.core.auth import ManagedKeys
from gateway.core.context import RequestContext
from gateway.core.hooks import (
    Admission,
    Cache,
    NoAdmission,
    NoCache,
    NoQueue,
    Observer,
    QueueSlots,
    Router,
    route_targets_in_order,
)
from gateway.core.live_policy import LivePolicy
from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.upstream.pool import Upstream, UpstreamPool
from policies.load import ModelTarget
from routing.stats import LiveStats
from routing.tokens import TokenCounter


class ReplicaChoice(Protocol):
    def choose(self, ctx: RequestContext, target: ModelTarget,
               upstream: Upstream) -> Upstream | None:
        """What this attempt is sent through: one replica of a dedicated backend's fleet
        (None: no replica can serve it)."""


@dataclass(frozen=True, slots=True)
class Hooks:
    """What the pipeline calls, fixed once the plug-ins are installed (`assemble`)."""

    admission: Admission = field(default_factory=NoAdmission)
    router: Router = route_targets_in_order
    queue: QueueSlots = field(default_factory=NoQueue)
    cache: Cache[Any] = field(default_factory=NoCache)
    observers: tuple[Observer, ...] = ()
    managed_keys: ManagedKeys | None = None  # found past the policy's keys (gateway/keys)
    # a dedicated backend's replica and cache salt per attempt (`gateway/route/replica_call`)
    replicas: ReplicaChoice | None = None
    max_attempts: int = 3  # candidates tried per request, the primary included


@dataclass(frozen=True, slots=True)
class Wiring:
    """What every plug-in is given: the app (for its routes, AppKeys and lifecycle) and
    the long-lived parts below the plug-ins' floor."""

    app: web.Application
    live: LivePolicy
    pool: UpstreamPool
    metrics: GatewayMetrics
    settings: Settings
    stats: LiveStats  # routing's live statistics: routing, health checks, shadow policy
    tokens: TokenCounter  # one tokenizer cache for admission, routing and shadow


@dataclass(frozen=True, slots=True)
class Provides:
    """The hooks a plug-in fills (None: not this one's); each may be filled once."""

    admission: Admission | None = None
    router: Router | None = None
    queue: QueueSlots | None = None
    cache: Cache | None = None
    observers: tuple[Observer, ...] = ()
    managed_keys: ManagedKeys | None = None  # keys authentication finds past the policy's
    replicas: ReplicaChoice | None = None  # a fleet's replica per attempt
    # wraps whichever queue is installed (routing counts in-flight requests around it)
    wraps_queue: Callable[[QueueSlots], QueueSlots] | None = None
    # wraps the admission installed before it (managed keys' limits around the tenant's)
    wraps_admission: Callable[[Admission], Admission] | None = None


NOTHING = Provides()

Plugin = Callable[[Wiring], Provides]


class HookTaken(RuntimeError):
    """Two plug-ins declared the same hook."""


def assemble(wiring: Wiring, plugins: Sequence[Plugin], *,
             observers: Sequence[Observer] = (), max_attempts: int = 3) -> Hooks:
    """Install `plugins` in order and fix the hooks they provide. `observers` come first
    (the app's own, e.g. the drain, which must see a request before any plug-in)."""
    defaults = Hooks()
    admission, router, queue, cache, keys, replicas = None, None, None, None, None, None
    told: list[Observer] = list(observers)
    wrappers: list[Callable[[QueueSlots], QueueSlots]] = []
    for plugin in plugins:
        provided = plugin(wiring)
        admission = _once("admission", admission, provided.admission)
        router = _once("router", router, provided.router)
        queue = _once("queue", queue, provided.queue)
        cache = _once("cache", cache, provided.cache)
        keys = _once("managed_keys", keys, provided.managed_keys)
        replicas = _once("replicas", replicas, provided.replicas)
        told.extend(provided.observers)
        if provided.wraps_queue is not None:
            wrappers.append(provided.wraps_queue)
        if provided.wraps_admission is not None:  # around what is installed so far
            admission = provided.wraps_admission(admission or defaults.admission)
    slots = queue or defaults.queue
    for wrap in wrappers:
        slots = wrap(slots)
    return Hooks(admission=admission or defaults.admission, router=router or defaults.router,
                 queue=slots, cache=cache or defaults.cache, observers=tuple(told),
                 managed_keys=keys, replicas=replicas, max_attempts=max_attempts)


T = TypeVar("T")


def _once(name: str, current: T | None, provided: T | None) -> T | None:
    if provided is None:
        return current
    if current is not None:
        raise HookTaken(f"two plug-ins provide the {name!r} hook")
    return provided
