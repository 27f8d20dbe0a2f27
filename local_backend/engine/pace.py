"""How fast the engine is going, to tell a request that cannot meet its deadline.

Every running sequence gets one token per step, so one sequence's decode rate is one
token per step time; a prompt takes one step per `max_num_batched_tokens` of it. Both
the step time and the usual completion length are moving averages of what the engine
has just done: until it has seen both, no request is judged doomed.
"""

from __future__ import annotations

from local_backend.engine.sequence import Sequence

SMOOTHING = 0.2  # weight of the newest sample in each moving average


class Pace:
    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.step_s: float | None = None
        self.completion_tokens: float | None = None

    def stepped(self, seconds: float) -> None:
        self.step_s = _moving(self.step_s, seconds)

    def finished(self, completion_tokens: int) -> None:
        self.completion_tokens = _moving(self.completion_tokens, float(completion_tokens))

    def service_s(self, seq: Sequence) -> float | None:
        """Seconds from admission to the end of a sequence not yet started: its prompt's
        steps, then one step per token it is expected to write (the usual completion
        length, or its `max_tokens` when that is fewer). None while the pace is unknown."""
        if self.step_s is None or self.completion_tokens is None:
            return None
        prefill_steps = -(-(seq.num_tokens - seq.num_computed) // self.tokens_per_step)
        tokens = min(float(seq.params.max_tokens), self.completion_tokens)
        return (prefill_steps + max(tokens - 1.0, 0.0)) * self.step_s

    def doomed(self, seq: Sequence, now: float) -> bool:
        """Admitted now, it would still end after its deadline."""
        if seq.deadline is None:
            return False
        service = self.service_s(seq)
        return service is not None and now + service > seq.deadline


def _moving(average: float | None, sample: float) -> float:
    return sample if average is None else average + SMOOTHING * (sample - average)
