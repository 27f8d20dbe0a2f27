"""Which replica of a dedicated backend serves a request: pure, from plain numbers.

    prefix       score = cached_weight × share of the prompt it likely holds
                         − queue_weight × its busy count − kv_weight × its KV use;
                 the highest wins, ties to the least busy; a cold prompt (no
                 replica holds any of it) goes to the replica holding the fewest
                 blocks of those at most one request busier than the least busy,
                 so new prefixes spread the cache evenly over the fleet
    least_busy   fewest requests queued or running (then lowest KV use, then order)
    round_robin  each in turn

A replica's busy count is the larger of the requests this gateway has outstanding on
it and the waiting + running requests it reports itself (other gateways' too).
Ejected replicas are left out, at most `max_ejected` of them (`routing.decide`'s cap),
so a bad minute never empties a fleet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.fleet_schema import PrefixPick


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica as the pick sees it."""

    name: str
    outstanding: int  # sent by this gateway, not finished
    waiting: int | None = None  # its own `/metrics` (fresh), when it has them
    running: int | None = None
    kv_use: float | None = None  # 0..1
    ejected_until: float | None = None  # None: in service

    @property
    def busy(self) -> int:
        reported = (self.waiting or 0) + (self.running or 0)
        return max(self.outstanding, reported)

    @property
    def queued(self) -> int:
        """Requests ahead of a new one (those beyond what it runs at once are unknown
        here: the waiting it reports, or what this gateway has outstanding)."""
        return self.waiting if self.waiting is not None else self.outstanding


@dataclass(frozen=True, slots=True)
class Pick:
    replica: str
    held_blocks: int  # blocks of the prompt it likely holds
    reason: str  # prefix | least_busy | round_robin | cold


def in_service(replicas: Sequence[ReplicaView], now: float,
               max_ejected: int) -> list[ReplicaView]:
    """`replicas` less the ejected ones, at most `max_ejected` of them (out the longest
    first); never all."""
    out = [r for r in replicas if r.ejected_until is not None and r.ejected_until > now]
    if not out:
        return list(replicas)
    out.sort(key=lambda r: r.ejected_until or 0.0, reverse=True)
    gone = {r.name for r in out[:min(max_ejected, len(replicas) - 1)]}
    return [r for r in replicas if r.name not in gone]


def _least_busy(replicas: Sequence[ReplicaView]) -> ReplicaView:
    return min(replicas, key=lambda r: (r.busy, r.kv_use or 0.0))


def pick(mode: str, replicas: Sequence[ReplicaView], *, held: Mapping[str, int],
         blocks: int, weights: PrefixPick, turn: int,
         cache_blocks: Mapping[str, int] | None = None) -> Pick | None:
    """`held`: blocks of the prompt each replica likely holds (`PrefixIndex.matched`);
    `blocks`: the prompt's full blocks; `turn`: a counter for round robin;
    `cache_blocks`: blocks of any prompt each replica likely holds (`PrefixIndex.held`)."""
    if not replicas:
        return None
    if mode == "round_robin":
        chosen = replicas[turn % len(replicas)]
        return Pick(chosen.name, held.get(chosen.name, 0), "round_robin")
    if mode == "prefix" and blocks and any(held.get(r.name, 0) for r in replicas):
        def score(r: ReplicaView) -> tuple[float, int]:
            share = held.get(r.name, 0) / blocks
            value = (weights.cached_weight * share - weights.queue_weight * r.busy
                     - weights.kv_weight * (r.kv_use or 0.0))
            return value, -r.busy
        chosen = max(replicas, key=score)
        return Pick(chosen.name, held.get(chosen.name, 0), "prefix")
    if mode == "prefix" and cache_blocks is not None:
        least = min(r.busy for r in replicas)
        near = [r for r in replicas if r.busy <= least + 1]
        chosen = min(near, key=lambda r: (cache_blocks.get(r.name, 0), r.busy))
        return Pick(chosen.name, 0, "cold")
    chosen = _least_busy(replicas)
    return Pick(chosen.name, held.get(chosen.name, 0),
                "cold" if mode == "prefix" else "least_busy")
