"""Requests sent again under one `Idempotency-Key` run once.

A caller that may send a request twice (a gateway replica that took a batch over from
one that died: it cannot know whether the lines the dead one had in flight ran) names
the request with a key. Per key, scoped by the request's `cache_salt` (the gateway's
per-tenant salt, so one tenant cannot read another's answer by guessing its key):

- while the first request with the key runs, another with the same key attaches to it
  and gets the same answer, byte for byte; the run is detached from the first caller's
  connection, so when that caller goes away the request still finishes and its answer
  is kept for the one that sends it again;
- a finished answer (status 200) is kept for `ttl_s` (oldest dropped first past
  `max_answers`) and returned again, marked `Idempotent-Replayed: true`, without running;
- an error is not kept: sent again, the request runs again;
- the same key with a different body is a 422 (`idempotency_key_reused`), never the
  other body's answer.

Only non-streamed requests take a key: a streamed one with a key is a 400, since a
stream cannot be replayed to a second reader. Nothing of a prompt or an answer is
logged; the answers are held in memory only.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter

from local_backend.server.errors import ApiError, bad_request

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_CHARS = 256
DEFAULT_TTL_S = 600.0
DEFAULT_MAX_ANSWERS = 10_000

Scope = tuple[str, str]  # (cache salt, key)
Run = Callable[[], Awaitable[web.StreamResponse]]  # the request, served once


@dataclass(frozen=True)
class IdempotencyLimits:
    ttl_s: float = DEFAULT_TTL_S  # how long a finished answer is kept
    max_answers: int = DEFAULT_MAX_ANSWERS  # 0: keys are not honoured (every request runs)

    def __post_init__(self) -> None:
        if not self.ttl_s > 0 or self.max_answers < 0:
            raise ValueError("the idempotency TTL must be positive and the answer count >= 0")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, response: web.StreamResponse) -> Answer:
        assert isinstance(response, web.Response) and isinstance(response.body, bytes)
        return cls(response.status, response.body, tuple(response.headers.items()))

    def response(self, replayed: bool) -> web.Response:
        headers = CIMultiDict(self.headers)
        if replayed:
            headers[REPLAYED_HEADER] = "true"
        return web.Response(status=self.status, body=self.body, headers=headers)


@dataclass
class _Entry:
    fingerprint: str
    run: asyncio.Task[Answer]
    expires_at: float = math.inf  # set when the run finishes with an answer


def key_of(headers: Mapping[str, str], *, stream: bool) -> str | None:
    """The request's key, checked: 1 to `MAX_KEY_CHARS` visible ASCII characters, on a
    request that is not streamed."""
    key = headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not 0 < len(key) <= MAX_KEY_CHARS or not all("!" <= c <= "~" for c in key):
        raise bad_request(f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_KEY_CHARS} visible ASCII "
                          "characters (no spaces or control characters)", IDEMPOTENCY_HEADER)
    if stream:
        raise bad_request(f"{IDEMPOTENCY_HEADER} is for non-streamed requests only: a stream "
                          "cannot be replayed to a second reader", IDEMPOTENCY_HEADER)
    return key


class KeptAnswers:
    """Runs and answers by (salt, key); every run is a task this object owns (`close`)."""

    def __init__(self, limits: IdempotencyLimits, registry: CollectorRegistry,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self.clock = limits, clock
        self._entries: OrderedDict[Scope, _Entry] = OrderedDict()
        self._outcomes = Counter(
            "routegate:idempotent_requests", "Requests with an Idempotency-Key: run, attached "
            "to the same key's run, or answered from a kept answer.", ["outcome"],
            registry=registry)

    @property
    def enabled(self) -> bool:
        return self.limits.max_answers > 0

    def __len__(self) -> int:
        return len(self._entries)

    async def once(self, scope: Scope, body: bytes,
                   run: Run) -> web.Response:
        """The answer of the one run under `scope`: started now, running, or kept."""
        now = self.clock()
        fingerprint = hashlib.sha256(body).hexdigest()
        entry = self._entries.get(scope)
        if entry is not None and entry.expires_at <= now:
            del self._entries[scope]
            entry = None
        if entry is None:
            self._drop_old(now)
            task = asyncio.ensure_future(self._answer(scope, run))
            task.add_done_callback(_retrieved)  # its error is read even if every caller left
            entry = self._entries[scope] = _Entry(fingerprint, task)
            outcome = "run"
        elif entry.fingerprint != fingerprint:
            raise ApiError(422, f"this {IDEMPOTENCY_HEADER} was sent before with a different "
                           "body", code="idempotency_key_reused", param=IDEMPOTENCY_HEADER)
        else:
            outcome = "replayed" if entry.run.done() else "attached"
        self._outcomes.labels(outcome).inc()
        # shielded: a caller that goes away leaves the run going for the next one
        answer = await asyncio.shield(entry.run)
        return answer.response(replayed=outcome != "run")

    async def _answer(self, scope: Scope, run: Run) -> Answer:
        try:
            response = await run()
        except BaseException:  # an error is not kept: sent again, the request runs again
            self._entries.pop(scope, None)
            raise
        answer = Answer.of(response)
        entry = self._entries.get(scope)
        if entry is not None:
            if answer.status == 200:
                entry.expires_at = self.clock() + self.limits.ttl_s
            else:
                del self._entries[scope]
        return answer

    def _drop_old(self, now: float) -> None:
        """From the oldest: expired answers, and kept ones while there are `max_answers`
        (a run is never dropped: it is looked past)."""
        for _ in range(len(self._entries)):
            scope, entry = next(iter(self._entries.items()))
            over = len(self._entries) >= self.limits.max_answers
            if entry.run.done() and (over or entry.expires_at <= now):
                del self._entries[scope]
            elif over and not entry.run.done():
                self._entries.move_to_end(scope)
            else:
                return

    async def close(self) -> None:
        """Cancel the runs still going (the server stops) and forget every answer."""
        runs = [entry.run for entry in self._entries.values() if not entry.run.done()]
        for task in runs:
            task.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        self._entries.clear()


def _retrieved(task: asyncio.Task[Answer]) -> None:
    if not task.cancelled():
        task.exception()
