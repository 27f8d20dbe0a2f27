"""How long and how many answers are kept by key, and that an error is never kept: plain
runs that count themselves, a clock moved by hand."""

from __future__ import annotations

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from local_backend.server.errors import ApiError
from local_backend.server.idempotency import IdempotencyLimits, KeptAnswers


class Runs:
    def __init__(self) -> None:
        self.count = 0
        self.fail_next: ApiError | None = None

    async def __call__(self) -> web.StreamResponse:
        self.count += 1
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return web.Response(body=f"answer {self.count}".encode())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def kept(clock: Clock, ttl_s: float = 600.0, max_answers: int = 10) -> KeptAnswers:
    return KeptAnswers(IdempotencyLimits(ttl_s, max_answers), CollectorRegistry(), clock)


async def text(answers: KeptAnswers, key: str, runs: Runs, salt: str = "s") -> str:
    response = await answers.once((salt, key), b"{}", runs)
    assert isinstance(response, web.Response) and isinstance(response.body, bytes)
    return response.body.decode()


async def test_an_answer_is_kept_for_the_ttl_then_the_request_runs_again() -> None:
    clock, runs = Clock(), Runs()
    answers = kept(clock, ttl_s=600.0)
    assert await text(answers, "k", runs) == "answer 1"
    clock.now += 599.0
    assert await text(answers, "k", runs) == "answer 1"
    clock.now += 2.0
    assert await text(answers, "k", runs) == "answer 2"


async def test_past_max_answers_the_oldest_is_dropped_first() -> None:
    clock, runs = Clock(), Runs()
    answers = kept(clock, max_answers=2)
    for key in ("a", "b", "c"):
        await text(answers, key, runs)
    assert len(answers) == 2
    assert await text(answers, "c", runs) == "answer 3"  # kept
    assert await text(answers, "a", runs) == "answer 4"  # dropped, so run again


async def test_an_error_is_not_kept_and_the_request_sent_again_runs() -> None:
    runs = Runs()
    answers = kept(Clock())
    runs.fail_next = ApiError(429, "busy", code="queue_full")
    with pytest.raises(ApiError):
        await text(answers, "k", runs)
    assert await text(answers, "k", runs) == "answer 2"
    assert await text(answers, "k", runs) == "answer 2"


async def test_an_answer_that_is_not_a_200_is_not_kept() -> None:
    answers = kept(Clock())
    count = 0

    async def refused() -> web.StreamResponse:
        nonlocal count
        count += 1
        return web.Response(status=503, body=b"shutting down")

    for _ in range(2):
        await answers.once(("s", "k"), b"{}", refused)
    assert count == 2 and len(answers) == 0


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="TTL"):
        IdempotencyLimits(ttl_s=0.0)
    with pytest.raises(ValueError, match="TTL"):
        IdempotencyLimits(max_answers=-1)
