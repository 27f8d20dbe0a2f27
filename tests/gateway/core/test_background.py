"""`Wakeup`: what a background loop sleeps on between its due times."""

from __future__ import annotations

import asyncio
import math
import time

from gateway.core.background import Wakeup


async def test_a_wait_ends_when_its_time_is_up() -> None:
    started = time.monotonic()
    await Wakeup().wait(0.05)
    assert 0.04 <= time.monotonic() - started < 1.0


async def test_a_set_ends_a_wait_early_even_an_endless_one() -> None:
    wakeup = Wakeup()
    waiting = asyncio.create_task(wakeup.wait(math.inf))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    wakeup.set()
    await asyncio.wait_for(waiting, 1.0)


async def test_a_set_while_the_loop_was_busy_is_not_lost_and_counts_once() -> None:
    wakeup = Wakeup()
    wakeup.set()  # something changed before the loop went to sleep
    started = time.monotonic()
    await wakeup.wait(math.inf)
    assert time.monotonic() - started < 0.5
    second = asyncio.create_task(wakeup.wait(math.inf))
    await asyncio.sleep(0.02)
    assert not second.done()  # the first wait took the set
    second.cancel()


async def test_a_due_time_already_past_does_not_wait() -> None:
    started = time.monotonic()
    await Wakeup().wait(-3.0)
    assert time.monotonic() - started < 0.5
