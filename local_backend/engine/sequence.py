"""One request inside the engine: its tokens, sampling parameters, KV blocks and timestamps."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from local_backend.engine.params import SamplingParams
from local_backend.engine.sampler import TokenLogprob


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Timings:
    """Monotonic seconds; `first_scheduled` is kept across preemptions (queue time counts once)."""

    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    timings: Timings
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks
    # Tokens whose K/V are in the cache; the next step computes tokens[num_computed:].
    num_computed: int = 0
    # Prompt tokens served from the prefix cache on first admission.
    num_cached: int = 0
    preemptions: int = 0
    deadline: float | None = None  # engine clock; past it the sequence ends ("deadline")
    priority: int = 1  # the band asked for: lower runs first (the gateway's tenant band)
    # the caller's `cache_salt`: seeds its block hashes, so its prefix blocks are found
    # only by requests with the same salt (a gateway sends one per tenant)
    cache_salt: str | None = None
    # a client's names for prefixes of the prompt: (tag, token blocks it covers), in
    # order (prefix_events.py); the first `tags_published` have been reported
    prefix_tags: tuple[tuple[int, int], ...] = ()
    tags_published: int = 0
    band: int = 1  # the band it is scheduled by: `priority`, raised by waiting (aging)
    band_since: float = 0.0  # when it entered `band` (engine clock)
    order: int = 0  # arrival order in the engine, the last tie-break
    finish_reason: str | None = None
    text: str = ""  # detokenised output, trimmed at a stop string
    emitted_chars: int = 0  # how much of `text` has been handed out
    # With stop strings, logprobs wait with the text they belong to: (where the token's
    # text starts in `text`, its logprobs). A token whose text a stop string cuts off
    # is never reported.
    held_logprobs: list[tuple[int, TokenLogprob]] = field(default_factory=list)

    @property
    def cache_root(self) -> int | None:
        """The hash the first block's hash chains from: None, or the salt's."""
        return None if self.cache_salt is None else hash(("cache_salt", self.cache_salt))

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
