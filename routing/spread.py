"""Load spreading among equal candidates: weights and the power of two choices.

With a route's `spread: {within: 5%}`, the leading candidates whose ordering figure
(amortised cost for `cheapest`, predicted total for `fastest`) is within 5 % of the
first's are equals. Two of them are drawn by `weights` (default 1 each), and the one
with fewer outstanding requests (in flight and queued) per unit of weight leads; the
others keep their order as fallbacks. So quota spreads across keys and regions, and
load across replicas, while a decision stays a function of its inputs: the two draws
(uniform in [0, 1)) are passed in, routing has no random source of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from routing.stats import StatsSnapshot


class _Ranked(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def total_ms(self) -> float: ...
    @property
    def cost_micro_usd(self) -> int: ...


R = TypeVar("R", bound=_Ranked)


@dataclass(frozen=True, slots=True)
class Spread:
    """Why the primary is the one it is, among equals (`policy explain` shows it)."""

    within_percent: float
    equals: tuple[str, ...]  # in the objective's order
    weights: tuple[float, ...]
    outstanding: tuple[int, ...]  # in flight + queued, per equal
    drawn: tuple[str, ...]  # one or two of `equals`
    chosen: str

    def to_dict(self) -> dict[str, Any]:
        return {"within_percent": self.within_percent, "chosen": self.chosen,
                "drawn": list(self.drawn), "equals": [
                    {"target": key, "weight": weight, "outstanding": outstanding}
                    for key, weight, outstanding in zip(
                        self.equals, self.weights, self.outstanding, strict=True)]}


def equals_count(candidates: Sequence[_Ranked], objective: str, within_percent: float) -> int:
    """How many leading candidates (ordered by `objective`) are within the tolerance."""
    def figure(candidate: _Ranked) -> float:
        return candidate.total_ms if objective == "fastest" else candidate.cost_micro_usd

    limit = figure(candidates[0]) * (1.0 + within_percent / 100.0)
    count = 1
    while count < len(candidates) and figure(candidates[count]) <= limit:
        count += 1
    return count


def pick(keys: Sequence[str], weights: Sequence[float], outstanding: Sequence[int],
         draws: tuple[float, float]) -> tuple[tuple[int, ...], int]:
    """(indices drawn, index chosen): two drawn by weight without replacement, the one
    with fewer outstanding requests per unit of weight chosen (ties: the first drawn)."""
    first = _weighted(weights, draws[0], skip=None)
    if len(keys) == 1:
        return (first,), first
    second = _weighted(weights, draws[1], skip=first)
    load_first = outstanding[first] / weights[first]
    load_second = outstanding[second] / weights[second]
    return (first, second), second if load_second < load_first else first


def spread_over(candidates: list[R], objective: str, within_percent: float,
                weights: Mapping[str, float], stats: StatsSnapshot,
                draws: tuple[float, float]) -> Spread | None:
    """Spread the lead over `candidates` (ordered, primary first): the chosen equal is
    moved to the front, in place. None when the first has no equal."""
    count = equals_count(candidates, objective, within_percent)
    if count < 2:
        return None
    equals = tuple(candidate.key for candidate in candidates[:count])
    weight_of = tuple(weights.get(key, 1.0) for key in equals)
    busy = []
    for key in equals:
        target = stats.target(key)
        busy.append(target.in_flight + target.queue_depth)
    drawn, chosen = pick(equals, weight_of, busy, draws)
    if chosen:
        candidates.insert(0, candidates.pop(chosen))
    return Spread(within_percent, equals, weight_of, tuple(busy),
                  tuple(equals[i] for i in drawn), equals[chosen])


def _weighted(weights: Sequence[float], draw: float, skip: int | None) -> int:
    total = sum(weight for i, weight in enumerate(weights) if i != skip)
    point = min(max(draw, 0.0), 1.0) * total
    last = 0
    for i, weight in enumerate(weights):
        if i == skip:
            continue
        last = i
        if point < weight:
            return i
        point -= weight
    return last  # draw == 1.0, or rounding: the last one
