"""Which tokens run in the next step: decodes of running sequences first, then prefill chunks.

Every step has a token budget. Running sequences go first (one token each when
decoding, a chunk when a long prompt is still being prefilled), so new prompts
never stall streams already in flight; waiting sequences are admitted in arrival
order with what budget is left. When a running sequence cannot get a block, the
most recently admitted one is preempted (its blocks freed, recomputed later).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from local_backend.engine.block_manager import BlockManager
from local_backend.engine.sequence import Sequence, Status


@dataclass
class Batch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)  # tokens computed this step, per sequence
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_new.append(n)


class Scheduler:
    def __init__(
        self, blocks: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int
    ) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            while not self.blocks.append(seq, n):
                victim = self.running.pop()
                self._preempt(victim, batch)
                if victim is seq:
                    break
            else:
                batch.add(seq, n)
                budget -= n
                i += 1
        if batch.preempted:
            return batch  # memory is short: admit nothing new this step
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            first_time = seq.timings.first_scheduled is None
            if not self.blocks.allocate(seq):
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            if first_time:
                seq.timings.first_scheduled = now
                seq.num_cached = seq.num_computed
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed, budget)
            batch.add(seq, n)
            budget -= n
        return batch

    def _preempt(self, seq: Sequence, batch: Batch) -> None:
        self.blocks.release(seq)
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence (finished or aborted) and free its blocks at once."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
