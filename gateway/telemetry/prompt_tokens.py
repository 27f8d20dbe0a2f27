"""Prompt tokens, and those a backend read from its prefix cache, per backend and fleet
replica: counted from each finished record (the hit rate is cached ÷ prompt tokens).

Read by `/metrics` (`routegate_prompt_tokens_total`, `routegate_cached_prompt_tokens_total`,
through the route plug-in's collector) and `/admin/backends` (each replica's figures).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.record import RequestRecord

MAX_SERIES = 1024  # (backend, replica) pairs counted; past it, `prune` drops gone replicas


class PromptTokens:
    def __init__(self) -> None:
        # (backend, replica or "") → [answered requests, prompt tokens, cached tokens]
        self.counts: dict[tuple[str, str], list[int]] = {}
        # set by the route plug-in: drops the pairs of replicas no fleet has any more
        self.prune: Callable[[dict[tuple[str, str], list[int]]], None] | None = None

    def observe(self, record: RequestRecord) -> None:
        """A finished request answered by a backend that reported its prompt tokens."""
        tokens = record.input_tokens
        if tokens is None:
            return
        attempt = record.attempt
        if attempt is None or not attempt.answered:
            return
        key = (attempt.backend, attempt.replica or "")
        counts = self.counts.get(key)
        if counts is None:
            if len(self.counts) >= MAX_SERIES and self.prune is not None:
                self.prune(self.counts)
            counts = self.counts[key] = [0, 0, 0]
        counts[0] += 1
        counts[1] += tokens
        counts[2] += record.cached_input_tokens or 0
