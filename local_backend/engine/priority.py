"""Who goes first: the order of waiting sequences, aging, and the per-band counters.

A request carries a priority band (an integer, lower runs first, as vLLM's
`priority`; the gateway sends its tenant's band) and maybe a deadline. Under the
`priority` policy waiting sequences are taken by (band, deadline, arrival), and a
sequence waiting longer than `aging_s` in its band rises one band, so a low band is
slowed by higher ones but never starved. Under `fcfs` they are taken by arrival alone
(the band is still counted in the metrics).

Bands from `background_band` down are background (the gateway sends its batch lines
there): under the priority policy a step holds either a better band's work or
background work, never both, and a background step is kept short. A running
background sequence is paused, its blocks kept, while better work runs; paused for
`aging_s` it rises one band like a waiting one, so it too is never starved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from local_backend.engine.sequence import Sequence

SchedulingMode = Literal["priority", "fcfs"]
TOP_BAND = 0  # aging raises a sequence no higher than this
DEFAULT_AGING_S = 10.0
# The gateway's `batch` band: work that runs only in steps nothing better wants.
DEFAULT_BACKGROUND_BAND = 3
# A step of background work alone computes at most this many tokens, so a request of a
# better band that arrives during it waits for a short step, not a long prefill.
DEFAULT_BACKGROUND_STEP_TOKENS = 32

SortKey = tuple[float, ...]


@dataclass(frozen=True)
class SchedulingPolicy:
    mode: SchedulingMode = "priority"
    aging_s: float = DEFAULT_AGING_S  # waiting this long in a band raises a sequence one band
    # Bands from this one down (numerically at or above it) are background: under the
    # priority policy they never share a step with a better band's work (None: no band is)
    background_band: int | None = DEFAULT_BACKGROUND_BAND
    background_step_tokens: int = DEFAULT_BACKGROUND_STEP_TOKENS

    @property
    def by_priority(self) -> bool:
        return self.mode == "priority"

    @property
    def background_from(self) -> int | None:
        """The first background band, or None when no band is (always so under fcfs)."""
        return self.background_band if self.by_priority else None

    @property
    def key(self) -> Callable[[Sequence], SortKey]:
        return priority_key if self.by_priority else arrival_key


def priority_key(seq: Sequence) -> SortKey:
    """Smaller first: band, then the earlier deadline (none is latest), then arrival."""
    deadline = math.inf if seq.deadline is None else seq.deadline
    return (seq.band, deadline, seq.timings.arrival, seq.order)


def arrival_key(seq: Sequence) -> SortKey:
    return (seq.order,)


def age(waiting: Iterable[Sequence], now: float, aging_s: float) -> bool:
    """Raise every sequence that has waited `aging_s` in its band by one band (as many
    bands as whole periods it waited); True if any rose."""
    rose = False
    for seq in waiting:
        if seq.band > TOP_BAND and now - seq.band_since >= aging_s:
            periods = int((now - seq.band_since) // aging_s)
            seq.band = max(TOP_BAND, seq.band - periods)
            seq.band_since += periods * aging_s
            rose = True
    return rose


def next_aging(waiting: Iterable[Sequence], aging_s: float) -> float:
    """The engine-clock time the next sequence rises a band (inf: none will)."""
    return min((s.band_since + aging_s for s in waiting if s.band > TOP_BAND), default=math.inf)


@dataclass
class BandCounters:
    """What happened to the requests of one band (by the band they asked for)."""

    admitted: int = 0  # first scheduled
    waited_s: float = 0.0  # arrival to first scheduled, summed over `admitted`
    preemptions: int = 0
    doomed: int = 0  # refused before prefill: could not finish by their deadline


@dataclass(frozen=True)
class BandStats:
    band: int
    waiting: int
    running: int
    admitted: int
    waited_s: float
    preemptions: int
    doomed: int


def band_stats(counters: dict[int, BandCounters], waiting: list[Sequence],
               running: list[Sequence]) -> tuple[BandStats, ...]:
    """A snapshot per band seen so far; read from another thread, so from copies."""
    counters = dict(counters)
    waiting_by, running_by = _count(list(waiting)), _count(list(running))
    bands = sorted({*counters, *waiting_by, *running_by})
    out = []
    for band in bands:
        c = counters.get(band) or BandCounters()
        out.append(BandStats(band, waiting_by.get(band, 0), running_by.get(band, 0),
                             c.admitted, c.waited_s, c.preemptions, c.doomed))
    return tuple(out)


def _count(seqs: list[Sequence]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for seq in seqs:
        counts[seq.priority] = counts.get(seq.priority, 0) + 1
    return counts
