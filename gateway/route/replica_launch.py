"""Launched replicas: the supervisor's children `name#i` of a `launch: {replicas: N}`
backend become replicas of its fleet, and the pool sees the backend up while any one
of them is (its capabilities from the first child that reports)."""

from __future__ import annotations

from gateway.route.replicas import Fleets
from gateway.upstream.pool import UpstreamPool
from policies.capabilities import ModelCapabilities

REPLICA_MARK = "#"  # `gateway/launch/supervisor.child_names`


def split_child(child: str) -> tuple[str, int | None]:
    name, mark, index = child.rpartition(REPLICA_MARK)
    return (name, int(index)) if mark and index.isdigit() else (child, None)


class FleetLaunches:
    """What the supervisor tells (`LaunchedBackends`): replicas to the fleets, the
    backend as a whole to the pool."""

    def __init__(self, pool: UpstreamPool, fleets: Fleets) -> None:
        self.pool, self.fleets = pool, fleets
        self._up: dict[str, set[int]] = {}

    def set_launched(self, name: str, url: str,
                     capabilities: ModelCapabilities | None = None) -> None:
        backend, index = split_child(name)
        if index is None:
            self.pool.set_launched(name, url, capabilities)
            return
        self.fleets.launched(backend, index, url)
        up = self._up.setdefault(backend, set())
        if not up:
            self.pool.set_launched(backend, url, capabilities)
        up.add(index)

    def set_down(self, name: str, reason: str) -> None:
        backend, index = split_child(name)
        if index is None:
            self.pool.set_down(name, reason)
            return
        self.fleets.launched(backend, index, None)
        up = self._up.setdefault(backend, set())
        up.discard(index)
        if not up:
            self.pool.set_down(backend, reason)
