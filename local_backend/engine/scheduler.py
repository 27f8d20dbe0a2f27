"""Which tokens run in the next step: decodes of running sequences first, then prefill chunks.

Every step has a token budget. Running sequences go first (one token each when
decoding, a chunk when a long prompt is still being prefilled), so new prompts
never stall streams already in flight; waiting sequences are admitted in the
policy's order (priority.py) with what budget is left. Running sequences are kept
in the same order, so the last one is always the one to give way: when a running
sequence cannot get a block, and, under the priority policy, when a waiting
sequence of a better band finds the batch full or the blocks short, the last
running one is preempted (its blocks freed, its prefix-cache blocks left cached,
recomputed later), never one of a better band for a worse one.

Background bands (priority.py) fill idle steps only: while a better band's sequence
runs or waits, running background sequences are left out of the step (paused, their
blocks kept); when none does, a step of background work alone runs, its tokens capped
so that a better request arriving meanwhile waits for a short step.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from local_backend.engine.block_manager import BlockManager
from local_backend.engine.pace import Pace
from local_backend.engine.priority import (
    BandCounters,
    BandStats,
    SchedulingPolicy,
    age,
    band_stats,
    next_aging,
)
from local_backend.engine.sequence import Sequence, Status


@dataclass
class Batch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)  # tokens computed this step, per sequence
    preempted: list[Sequence] = field(default_factory=list)
    background: bool = False  # a step of background work alone (shortened, not paced)

    def add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_new.append(n)


class Scheduler:
    def __init__(
        self, blocks: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
        policy: SchedulingPolicy | None = None,
    ) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy or SchedulingPolicy()
        self.key = self.policy.key
        self.pace = Pace(max_num_batched_tokens)
        # In the policy's order, best first: a newcomer is inserted in its place, and only
        # aging re-sorts it, into a new list (another thread reading its length must
        # never see it empty, as it is while sorted in place).
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.bands: dict[int, BandCounters] = {}
        self._arrivals = 0
        self._next_aging = math.inf

    def add(self, seq: Sequence) -> None:
        self._arrivals += 1
        seq.order = self._arrivals
        seq.band, seq.band_since = seq.priority, seq.timings.arrival
        self._requeue(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def band_stats(self) -> tuple[BandStats, ...]:
        return band_stats(self.bands, self.waiting, self.running)

    def overdue(self, now: float) -> list[Sequence]:
        """Sequences to end now for their deadline: past it, or (not yet started) unable
        to finish before it at the engine's current pace."""
        pace = self.pace
        late = [s for s in self.running if s.deadline is not None and s.deadline <= now]
        for seq in self.waiting:
            if seq.deadline is None:
                continue
            if seq.deadline <= now:
                late.append(seq)
            elif seq.timings.first_scheduled is None and pace.doomed(seq, now):
                self._band(seq).doomed += 1
                late.append(seq)
        return late

    def outranks_waiting(self, band: int) -> bool:
        """A request of `band` may enter a full queue: a worse one not yet started waits
        there, and will be shed for it (`shed`). Called from the event loop: a copy."""
        return self.policy.by_priority and any(
            s.band > band and s.timings.first_scheduled is None for s in list(self.waiting))

    def shed(self, limit: int) -> list[Sequence]:
        """The waiting sequences not yet started to drop so that at most `limit` wait
        (a better band entered a full queue): the worst in the policy's order."""
        excess = len(self.waiting) - limit
        if excess <= 0:
            return []
        fresh = sorted((s for s in self.waiting if s.timings.first_scheduled is None),
                       key=self.key)
        return fresh[len(fresh) - min(excess, len(fresh)):]

    def schedule(self, now: float) -> Batch:
        self._order_waiting(now)
        self.running = sorted(self.running, key=self.key)
        batch = Batch()
        if self.policy.by_priority and self.waiting and self.running:
            self._displace(batch, now)  # the displaced go back to their places in the queue
        budget = self.max_num_batched_tokens
        stepped, admit_below = len(self.running), math.inf
        background = self.policy.background_from
        if background is not None:
            stepped = bisect.bisect_left(self.running, background, key=_band_of)
            if stepped or (self.waiting and self.waiting[0].band < background):
                admit_below = background
                self._pause(self.running[stepped:], now)
            else:
                stepped = len(self.running)
                budget = min(budget, self.policy.background_step_tokens)
                batch.background = True
                for seq in self.running:
                    seq.band_since = now  # a pause is timed from the last background step
        short = False
        i = 0
        while i < min(stepped, len(self.running)) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            while not self.blocks.append(seq, n):
                victim = self.running.pop()
                self._preempt(victim, batch, now)
                short = True
                if victim is seq:
                    break
            else:
                batch.add(seq, n)
                budget -= n
                i += 1
        if short:
            return batch  # memory is short: admit nothing new this step
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.band >= admit_below:
                break  # background waits while better work runs
            first_time = seq.timings.first_scheduled is None
            if not self.blocks.allocate(seq):
                break
            self.waiting.pop(0)
            seq.status = Status.RUNNING
            if first_time:
                seq.timings.first_scheduled = now
                seq.num_cached = seq.num_computed
                counters = self._band(seq)
                counters.admitted += 1
                counters.waited_s += now - seq.timings.arrival
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed, budget)
            batch.add(seq, n)
            budget -= n
        return batch

    def _pause(self, paused: list[Sequence], now: float) -> None:
        """Background sequences left out of this step: one paused for `aging_s` since the
        last background step (`band_since`) rises a band, and from the next step on runs
        with better work."""
        age(paused, now, self.policy.aging_s)

    def _order_waiting(self, now: float) -> None:
        """Raise the sequences that waited long enough; re-sort only if one rose."""
        if self.policy.by_priority and now >= self._next_aging:
            if age(self.waiting, now, self.policy.aging_s):
                self.waiting = sorted(self.waiting, key=self.key)
            self._next_aging = next_aging(self.waiting, self.policy.aging_s)

    def _displace(self, batch: Batch, now: float) -> None:
        """Preempt running sequences of a worse band than the best waiting ones, as far as
        those need a batch slot or blocks. Waiting sequences are taken in order, and only
        while they are of a better band than the worst running one; the first that cannot
        be made to fit ends the pass (nothing overtakes it)."""
        slots = self.max_num_seqs - len(self.running)
        promised = 0  # blocks the waiting sequences before this one will take
        for seq in list(self.waiting):
            if not self.running or self.running[-1].band <= seq.band:
                return  # the rest are of this band or worse: nobody to displace
            while slots < 1 or not self._fits(seq, promised):
                worst = self.running[-1] if self.running else None
                if worst is None or worst.band <= seq.band:
                    return
                self.running.pop()
                self._preempt(worst, batch, now)
                slots += 1
            slots -= 1
            promised += self.blocks.blocks_to_admit(seq)

    def _fits(self, seq: Sequence, promised: int) -> bool:
        return (self.blocks.num_free - promised - self.blocks.blocks_to_admit(seq)
                >= self.blocks.watermark)

    def _preempt(self, seq: Sequence, batch: Batch, now: float) -> None:
        self.blocks.release(seq)
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self._band(seq).preemptions += 1
        seq.band_since = now  # it keeps the band it had; its wait for the next starts now
        self._requeue(seq)
        batch.preempted.append(seq)

    def _requeue(self, seq: Sequence) -> None:
        bisect.insort(self.waiting, seq, key=self.key)
        self._next_aging = min(self._next_aging, seq.band_since + self.policy.aging_s)

    def _band(self, seq: Sequence) -> BandCounters:
        counters = self.bands.get(seq.priority)
        if counters is None:
            counters = self.bands[seq.priority] = BandCounters()
        return counters

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence (finished or aborted) and free its blocks at once."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason


def _band_of(seq: Sequence) -> int:
    return seq.band
