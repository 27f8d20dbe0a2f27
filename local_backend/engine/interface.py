"""What the engine takes and gives (re-exported by `loop.py`): its configuration, each
request's outputs, its statistics, and its two refusals."""

from __future__ import annotations

from dataclasses import dataclass, field

from local_backend.engine.priority import (
    DEFAULT_AGING_S,
    DEFAULT_BACKGROUND_BAND,
    DEFAULT_BACKGROUND_STEP_TOKENS,
    BandStats,
    SchedulingMode,
)
from local_backend.engine.runner import Backend
from local_backend.engine.sampler import TokenLogprob
from local_backend.engine.sequence import Timings


class QueueFull(Exception):
    """The waiting queue is at `max_waiting`; the caller should answer 429."""


class RequestRejected(ValueError):
    """The request can never run (prompt too long for the model or the KV cache)."""


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 32
    max_waiting: int = 256
    block_size: int = 16
    num_blocks: int = 1024
    max_num_batched_tokens: int = 512  # per step: decode tokens + prefill chunks
    max_model_len: int = 2048
    prefix_caching: bool = True
    scheduling_policy: SchedulingMode = "priority"  # or "fcfs": arrival order alone
    priority_aging_s: float = DEFAULT_AGING_S  # a wait this long raises a request one band
    # bands from this one down run only in steps no better band wants (None: none do)
    background_band: int | None = DEFAULT_BACKGROUND_BAND
    background_step_tokens: int = DEFAULT_BACKGROUND_STEP_TOKENS  # a background step's tokens
    attention: Backend = "sdpa"  # the runner's attention (engine/runner.py)
    cuda_graphs: bool = False  # decode steps replayed from CUDA graphs (CUDA and sdpa only)


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    text: str  # new text since the previous output (may be empty while a stop string is possible)
    token_ids: list[int]
    time: float  # monotonic time the newest token was produced
    finished: bool = False
    finish_reason: str | None = None  # stop | length | deadline | shed | abort | error | shutdown
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    preemptions: int = 0
    timings: Timings | None = None  # set on the final output


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_usage: float
    free_blocks: int
    num_blocks: int
    preemptions: int
    aborted: int  # requests cancelled before they finished (client gone)
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found there
    bands: tuple[BandStats, ...] = ()  # per priority band asked for
