"""The one health model per target ("backend/model"): outlier ejection, Envoy-style,
fed by request outcomes and by the backend's active health checks.

    in service ──(N failures in a row)──► ejected ──(time up)──► one probe ──► in service
                                              ▲                     │ fails
                                              └─────────────────────┘ (ejected longer)

A failure is what says the target itself is broken: a connect error, a timeout, a 5xx.
A 429 is an answer (the target is up and busy): it counts as a success here.
Active health checks feed the same state: a passing check is the probe of a target
whose ejection time is up (no client request has to risk it), a failing one while
probing ejects it again; `unhealthy_threshold` failed checks in a row take the target
down (`check_failed`) until `healthy_threshold` pass, which no cap overrides: a backend
that says it is not serving is not sent requests. Every other exclusion is an
ejection, and `decide` applies the route's `max_ejection_percent` to those.
The n-th ejection in a row lasts n × `base_ejection_s` (at most `max_ejection_s`); a
target that stays in service for `max_ejection_s` starts counting from one again.
Once its time is up the first attempt that starts on it is the probe; until the probe
reports (or `base_ejection_s` passes, for a probe that never does), the target stays out.

`Ejections` is mutable like `LiveStats` and writes each change into it, so `decide`
reads ejection from the same snapshot (`StatsSnapshot.ejected`) and applies the route's
`max_ejection_percent`. Called from the event loop only; `now` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.resilience import OutlierDetection
from routing.stats import LiveStats


@dataclass(slots=True)
class _Target:
    failures: int = 0  # consecutive
    ejections: int = 0  # in a row: grows the next ejection's length
    until: float | None = None  # out of service until then; None: in service
    probing: bool = False
    restored_at: float | None = None
    total_ejections: int = 0
    down: bool = False  # failing its active health checks


class Ejections:
    def __init__(self, stats: LiveStats) -> None:
        self.stats = stats
        self._targets: dict[str, _Target] = {}

    def _target(self, key: str) -> _Target:
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = _Target()
        return target

    def failed(self, key: str, now: float, settings: OutlierDetection) -> bool:
        """An attempt on `key` failed with a connect error, a timeout or a 5xx; True when
        that ejects it."""
        if not settings.enabled:
            return False
        target = self._target(key)
        target.failures += 1
        if target.until is not None:
            if target.probing or now >= target.until:  # the probe failed
                self._eject(key, target, now, settings)
                return True
            return False  # a request sent before the ejection, failing late
        if target.failures >= settings.consecutive_failures:
            self._eject(key, target, now, settings)
            return True
        return False

    def succeeded(self, key: str, now: float) -> bool:
        """An attempt on `key` was answered (a 2xx, or a 4xx about the request); True
        when that puts it back in service."""
        target = self._targets.get(key)
        if target is None:
            return False
        target.failures = 0
        if target.until is not None and (target.probing or now >= target.until):
            target.until, target.probing, target.restored_at = None, False, now
            self.stats.restore(key)
            return True
        return False

    def attempt_started(self, key: str, now: float, settings: OutlierDetection) -> None:
        """An attempt on `key` begins: once its ejection is over, the first is the probe,
        and the target stays out for everyone else until it reports."""
        target = self._targets.get(key)
        if target is None or target.until is None or target.probing or now < target.until:
            return
        target.probing = True
        target.until = now + settings.base_ejection_s
        self.stats.eject(key, target.until)

    def forget(self, key: str) -> None:
        """`key` is gone for good (a replica that left its fleet)."""
        self._targets.pop(key, None)
        self.stats.forget(key)

    def check_passed(self, key: str, now: float, *, back_up: bool) -> None:
        """An active health check of `key`'s backend passed; `back_up`: enough in a row
        to end a `check_failed` down state. Ends an ejection whose time is up (the check
        was its probe)."""
        target = self._target(key)
        if back_up and target.down:
            target.down, target.failures = False, 0
            self.stats.mark_unhealthy(key, None)
        if target.until is not None and (target.probing or now >= target.until):
            target.until, target.probing, target.restored_at = None, False, now
            target.failures = 0
            self.stats.restore(key)

    def check_failed(self, key: str, now: float, settings: OutlierDetection, *,
                     down: bool) -> None:
        """An active health check of `key`'s backend failed; `down`: enough in a row
        to take it out until checks pass again. A failed check of a target whose
        ejection time is up is a failed probe."""
        target = self._target(key)
        if down and not target.down:
            target.down = True
            self.stats.mark_unhealthy(key, float("inf"))
        if settings.enabled and target.until is not None and \
                (target.probing or now >= target.until):
            self._eject(key, target, now, settings)

    def _eject(self, key: str, target: _Target, now: float,
               settings: OutlierDetection) -> None:
        if target.restored_at is not None and now - target.restored_at >= settings.max_ejection_s:
            target.ejections = 0  # in service long enough: the count starts again
        target.ejections += 1
        target.total_ejections += 1
        target.failures, target.probing = 0, False
        target.until = now + min(settings.base_ejection_s * target.ejections,
                                 settings.max_ejection_s)
        self.stats.eject(key, target.until)

    def state(self, key: str, now: float) -> str:
        """`unhealthy` (its health checks fail), `in_service`, `ejected` or `probing`."""
        target = self._targets.get(key)
        if target is not None and target.down:
            return "unhealthy"
        if target is None or target.until is None:
            return "in_service"
        return "probing" if target.probing else "ejected" if now < target.until else "probing"

    def report(self, now: float) -> dict[str, dict[str, Any]]:
        """Every target seen so far: its state, failures in a row and ejections."""
        return {key: {
            "state": self.state(key, now),
            "consecutive_failures": target.failures,
            "ejections_in_a_row": target.ejections,
            "ejections_total": target.total_ejections,
            "ejected_for_s": None if target.until is None
            else round(max(0.0, target.until - now), 3),
        } for key, target in sorted(self._targets.items())}

    def ejected_keys(self, now: float) -> list[str]:
        return [key for key, target in self._targets.items() if target.until is not None]
