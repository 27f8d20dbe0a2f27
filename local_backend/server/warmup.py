"""Warm-up before the server answers `/health`: real forwards at the shapes it will serve,
then the prefill and decode rates measured on the warm engine.

torch initialises lazily on a thread's first calls (its OpenMP thread team, oneDNN's
kernels per shape, the allocator's pools): before this, an engine's first requests
were an order of magnitude slower than the next ones, while the gateway already
counted the backend as ready. So the engine first runs a batch like the ones it will
serve (a long prompt beside a short one, then decodes of both, then of one), and only
then is one request timed: its
prefill rate (prompt tokens per second from first scheduled to first token) and its
decode rate (tokens per second of one stream). The server reports both at `/health`
and on its model card, where the gateway's latency prediction takes them up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from local_backend.engine.loop import Engine, RequestOutput
from local_backend.engine.params import SamplingParams

log = logging.getLogger("local_backend.warmup")

LONG_PROMPT_TOKENS = 128  # the warm batch's long prompt, at most (CPU's step budget: 256)
SHORT_PROMPT_TOKENS = 16
TIMED_PROMPT_TOKENS = 32  # about a short chat turn: the prefill rate most requests see
TIMED_DECODE_TOKENS = 6


@dataclass(frozen=True)
class MeasuredRates:
    """Tokens per second of the warm engine: prompt reading, and one stream's decode."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    warmup_s: float  # the whole warm-up, for the log

    def report(self) -> dict[str, float]:
        return {"prefill_tokens_per_s": round(self.prefill_tokens_per_s, 1),
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 1)}


def _prompt(length: int, salt: int, vocab: int) -> list[int]:
    """Token ids that no other warm-up prompt shares a block with (no prefix-cache hit,
    which would make the timed prefill free)."""
    return [(salt * 7919 + i * 104729) % (vocab - 1) + 1 for i in range(length)]


async def _run(engine: Engine, request_id: str, prompt: list[int],
               max_tokens: int) -> RequestOutput:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs = engine.add_request(request_id, prompt, params)
    while True:
        output = await outputs.get()
        if output.finished:
            if output.finish_reason not in ("length", "stop"):
                raise RuntimeError(f"warm-up request ended with {output.finish_reason!r}")
            return output


async def warm_up(engine: Engine) -> MeasuredRates:
    """Run the warm-up batch, then time one request; the engine must be started."""
    started = time.monotonic()
    vocab = engine.runner.model.config.vocab_size
    room = engine.max_model_len - TIMED_DECODE_TOKENS - 1
    longest = max(1, min(engine.config.max_num_batched_tokens, LONG_PROMPT_TOKENS, room))
    # Both prefills in one step, decodes of two sequences, then of the short one alone.
    await asyncio.gather(
        _run(engine, "warmup-long", _prompt(longest, 1, vocab), 2),
        _run(engine, "warmup-short", _prompt(min(longest, SHORT_PROMPT_TOKENS), 2, vocab), 4))
    timed = await _run(engine, "warmup-timed",
                       _prompt(min(longest, TIMED_PROMPT_TOKENS), 3, vocab),
                       TIMED_DECODE_TOKENS)
    t = timed.timings
    assert t is not None and t.first_scheduled is not None and t.first_token is not None
    assert t.last_token is not None
    prefill_s = max(t.first_token - t.first_scheduled, 1e-6)
    decode_s = max(t.last_token - t.first_token, 1e-6)
    rates = MeasuredRates(
        prefill_tokens_per_s=timed.prompt_tokens / prefill_s,
        decode_tokens_per_s=(timed.completion_tokens - 1) / decode_s,
        warmup_s=time.monotonic() - started)
    log.info("warmed up in %.2fs: prefill %.0f tokens/s (%d-token prompt), decode %.1f "
             "tokens/s (one stream)", rates.warmup_s, rates.prefill_tokens_per_s,
             timed.prompt_tokens, rates.decode_tokens_per_s)
    return rates
