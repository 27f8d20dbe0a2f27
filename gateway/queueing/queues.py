"""All backends' queues: where the pipeline acquires slots and routing reads live depth.

A queue is keyed by backend name, or by `backend/model` where a model has a
concurrency limit of its own (a backend serving two models from separate
engines). A key with no configured limit still counts its in-flight requests
(for metrics and routing) but never makes anyone wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.queueing.clock import Clock, MonotonicClock
from gateway.queueing.shedding import ShedPolicy
from gateway.queueing.slots import Acquisition, QueueCounters, SlotQueue
from policies.backend_schema import Backend
from policies.bands import BATCH_BAND, PRIORITIES, Priority
from policies.load import ModelTarget, Policy

DEFAULT_SERVICE_S = 1.0  # slot hold time assumed before any request has finished
# Output length assumed when turning a backend's declared decode speed into a
# hold-time prior (the route's `expected_output_tokens` default).
PRIOR_OUTPUT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """Plain values for routing's latency prediction and for metrics gauges."""

    key: str
    limit: int | None
    in_flight: int
    background: Priority | None  # the band run in the background here (SlotQueue)
    background_in_flight: int  # of in_flight: slots held in the background band
    waiting: int
    waiting_by_priority: Mapping[Priority, int]
    mean_service_s: float
    predicted_wait_s: Mapping[Priority, float]
    counters: QueueCounters


class BackendQueues:
    def __init__(self, *, clock: Clock | None = None, shed: ShedPolicy | None = None,
                 tenant_weights: Mapping[str, float] | None = None,
                 default_service_s: float = DEFAULT_SERVICE_S, share: int = 1) -> None:
        self.clock: Clock = clock or MonotonicClock()
        # `serve --workers N`: each worker holds 1/N of every limit (at least 1), so
        # together they never exceed it without a round trip per request to share slots
        self._share = share
        self._shed = shed or ShedPolicy()
        self._weights = dict(tenant_weights or {})
        self._default_service_s = default_service_s
        self._queues: dict[str, SlotQueue] = {}
        self._model_keys: set[str] = set()  # model queues the current policy limits

    @classmethod
    def from_policy(cls, policy: Policy, *, clock: Clock | None = None,
                    shed: ShedPolicy | None = None,
                    tenant_weights: Mapping[str, float] | None = None) -> BackendQueues:
        queues = cls(clock=clock, shed=shed, tenant_weights=tenant_weights)
        queues.apply_policy(policy)
        return queues

    def apply_policy(self, policy: Policy) -> None:
        """Take limits from a (re)loaded policy; waiters already queued keep their place."""
        self._weights.update(
            (name, tenant.queue_weight) for name, tenant in policy.file.tenants.items())
        model_keys = set()
        for target in policy.targets.values():
            if target.spec.max_concurrency is not None:
                model_keys.add(target.key)
                self.set_limit(target.key, target.spec.max_concurrency,
                               service_prior_s=_service_prior_s(target))
        for key in self._model_keys - model_keys:
            # The model lost its own limit (or left the policy): its waiters are served
            # now, and its next requests wait in the backend's queue again. Tickets
            # still held release into the old queue object, harmlessly.
            self._queues.pop(key).set_limit(None)
        self._model_keys = model_keys
        for name, backend in policy.file.backends.items():
            if not backend.enabled:
                continue
            models = [t for t in policy.targets.values() if t.backend_name == name]
            prior = _service_prior_s(models[0]) if models else self._default_service_s
            self.set_limit(name, backend.max_concurrency, service_prior_s=prior)
            background = _background_band(policy, backend)
            for key in (name, *(t.key for t in models if t.key in model_keys)):
                self.set_background(key, background)

    def set_limit(self, key: str, limit: int | None, *,
                  service_prior_s: float | None = None) -> None:
        """Set a queue's concurrency limit: from the policy, or what the backend reports."""
        if limit is not None and self._share > 1:
            limit = max(1, limit // self._share)
        queue = self._queues.get(key)
        if queue is None:
            self._queues[key] = SlotQueue(
                key, limit=limit, clock=self.clock, shed=self._shed, weight_of=self._weight_of,
                service_prior_s=service_prior_s or self._default_service_s,
            )
        else:
            queue.set_limit(limit)
            if service_prior_s is not None:
                queue.set_service_prior(service_prior_s)

    def set_background(self, key: str, priority: Priority | None) -> None:
        """Run `priority` in the background on `key` (SlotQueue.background)."""
        self._queue(key).set_background(priority)

    def queue_key(self, target: ModelTarget) -> str:
        """Which queue a routed target waits in first (its own, else its backend's)."""
        return target.key if target.key in self._queues else target.backend_name

    def queue_keys(self, target: ModelTarget) -> tuple[str, ...]:
        """Every queue a routed target holds a slot in, innermost first: a model with
        a limit of its own waits in its own queue, then in its backend's, so the
        backend's `max_concurrency` bounds all of its models together."""
        if target.key in self._queues:
            return (target.key, target.backend_name)
        return (target.backend_name,)

    def acquire(self, key: str, *, tenant: str, priority: Priority = "normal",
                deadline: float | None = None, now: float | None = None) -> Acquisition:
        """A slot on `key`; `deadline` and `now` are on `self.clock` (monotonic seconds).

        Raises (on await / enter) `QueueRejected` subclasses when not admitted — try
        the next candidate — and `QueueDeadlinePassed` when the deadline passes while
        waiting. A cancelled waiter leaves the queue at once.
        """
        return Acquisition(self._queue(key), tenant, priority, deadline, now)

    def predicted_wait_s(self, key: str, priority: Priority = "normal") -> float:
        queue = self._queues.get(key)
        return 0.0 if queue is None else queue.predicted_wait_s(priority)

    def waiting(self, key: str) -> int:
        """Requests waiting for `key` now (cheap: for routing's live statistics)."""
        queue = self._queues.get(key)
        return 0 if queue is None else queue.waiting

    def in_flight(self, key: str) -> int:
        queue = self._queues.get(key)
        return 0 if queue is None else queue.in_flight

    def snapshot(self, key: str) -> QueueSnapshot:
        queue = self._queue(key)
        return QueueSnapshot(
            key=key, limit=queue.limit, in_flight=queue.in_flight,
            background=queue.background, background_in_flight=queue.background_in_flight,
            waiting=queue.waiting,
            waiting_by_priority=queue.waiting_by_priority(),
            mean_service_s=queue.mean_service_s,
            predicted_wait_s={p: queue.predicted_wait_s(p) for p in PRIORITIES},
            counters=QueueCounters(**{
                name: getattr(queue.counters, name) for name in QueueCounters.__slots__
            }),
        )

    def snapshots(self) -> dict[str, QueueSnapshot]:
        return {key: self.snapshot(key) for key in self._queues}

    def _queue(self, key: str) -> SlotQueue:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = SlotQueue(
                key, limit=None, clock=self.clock, shed=self._shed, weight_of=self._weight_of,
                service_prior_s=self._default_service_s,
            )
        return queue

    def _weight_of(self, tenant: str) -> float:
        return self._weights.get(tenant, 1.0)


def _background_band(policy: Policy, backend: Backend) -> Priority | None:
    """The band a backend's queues run in the background: batch lines, where the
    backend's scheduler hears the band and sets them aside for better work."""
    if policy.file.batches.background_slots and backend.band_carrier != "none":
        return BATCH_BAND
    return None


def _service_prior_s(target: ModelTarget) -> float:
    """Declared time-to-first-token plus decoding a typical answer at the declared speed."""
    priors = target.spec.priors
    ttft_s = (priors.ttft_ms or 0.0) / 1000.0 + priors.network_ms / 1000.0
    return ttft_s + PRIOR_OUTPUT_TOKENS / priors.decode_tokens_per_s
