"""Slots and waiting: the basic contract of a backend queue."""

import asyncio

import pytest

from gateway.queueing import BackendQueues
from tests.gateway.queueing.harness import Harness, ManualClock, settle


def make(clock: ManualClock, limit: int | None = 1) -> Harness:
    queues = BackendQueues(clock=clock)
    queues.set_limit("local", limit)
    return Harness(queues, "local")


async def test_request_with_a_free_slot_does_not_wait(clock: ManualClock) -> None:
    h = make(clock, limit=2)
    ticket = await h.queues.acquire("local", tenant="acme")
    assert ticket.waited_s == 0.0
    assert h.queues.snapshot("local").in_flight == 1


async def test_request_beyond_the_limit_waits_until_a_slot_is_released(
        clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("first", "second")
    assert h.granted == ["first"]
    assert h.queues.snapshot("local").waiting == 1
    clock.advance(2.5)
    await h.finish("first")
    assert h.granted == ["first", "second"]
    assert h.tickets["second"].waited_s == pytest.approx(2.5)


async def test_released_slot_is_handed_to_the_waiter_not_to_a_newcomer(
        clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder", "waiter")
    h.tickets["holder"].release()
    h.arrive("newcomer")  # arrives in the same loop turn as the release
    await settle()
    assert h.granted == ["holder", "waiter"]
    assert h.queues.snapshot("local").in_flight == 1


async def test_release_is_idempotent(clock: ManualClock) -> None:
    h = make(clock, limit=2)
    ticket = await h.queues.acquire("local", tenant="acme")
    ticket.release()
    ticket.release()
    assert h.queues.snapshot("local").in_flight == 0


async def test_context_manager_releases_the_slot_when_the_body_raises(
        clock: ManualClock) -> None:
    h = make(clock)
    with pytest.raises(RuntimeError):
        async with h.queues.acquire("local", tenant="acme"):
            raise RuntimeError("upstream failed")
    assert h.queues.snapshot("local").in_flight == 0


async def test_raising_the_limit_serves_waiters_at_once(clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("a", "b", "c")
    h.queues.set_limit("local", 3)
    await settle()
    assert h.granted == ["a", "b", "c"]


async def test_lowering_the_limit_lets_in_flight_requests_drain(clock: ManualClock) -> None:
    h = make(clock, limit=2)
    await h.arrive_all("a", "b", "c")
    h.queues.set_limit("local", 1)
    await h.finish("a")
    assert h.granted == ["a", "b"]  # b already held a slot; c waits for the new limit
    await h.finish("b")
    assert h.granted == ["a", "b", "c"]


async def test_backend_without_a_limit_never_queues_but_counts_in_flight(
        clock: ManualClock) -> None:
    h = make(clock, limit=None)
    await h.arrive_all(*"abcdef")
    snapshot = h.queues.snapshot("local")
    assert (snapshot.in_flight, snapshot.waiting) == (6, 0)


async def test_unknown_key_is_an_unlimited_queue(clock: ManualClock) -> None:
    queues = BackendQueues(clock=clock)
    ticket = await queues.acquire("elsewhere", tenant="acme")
    assert queues.snapshot("elsewhere").limit is None
    ticket.release()


async def test_cancelled_waiter_leaves_the_queue_at_once(clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder", "gone", "next")
    h.tasks["gone"].cancel()
    await settle()
    assert h.queues.snapshot("local").waiting == 1
    await h.finish("holder")
    assert h.granted == ["holder", "next"]
    assert h.tasks["gone"].cancelled()
    assert h.queues.snapshot("local").counters.cancelled == 1


async def test_waiter_cancelled_just_after_its_grant_passes_the_slot_on(
        clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder", "granted-then-gone", "next")
    h.tickets["holder"].release()  # grants the slot to the second waiter...
    h.tasks["granted-then-gone"].cancel()  # ...whose client leaves before it resumes
    await settle()
    assert h.granted == ["holder", "next"]
    assert h.queues.snapshot("local").in_flight == 1


async def test_waiter_cancelled_in_the_same_turn_as_a_release_does_not_get_the_slot(
        clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder", "gone", "next")
    h.tasks["gone"].cancel()  # its future is cancelled but its cleanup has not run
    h.tickets["holder"].release()
    await settle()
    assert h.granted == ["holder", "next"]
    assert h.queues.snapshot("local").in_flight == 1


async def test_deadline_passing_in_the_queue_fails_the_waiter_with_its_wait(
        clock: ManualClock) -> None:
    from gateway.queueing import QueueDeadlinePassed

    h = make(clock)
    h.queues.set_limit("local", 1, service_prior_s=0.1)
    await h.arrive_all("holder")
    h.arrive("late", deadline=clock.now() + 3.0)
    await settle()
    clock.advance(3.0)
    await settle()
    assert isinstance(h.failed["late"], QueueDeadlinePassed)
    assert "waited 3.00 s" in str(h.failed["late"])
    assert h.queues.snapshot("local").waiting == 0


async def test_waiter_whose_deadline_passed_is_not_granted_a_slot(clock: ManualClock) -> None:
    from gateway.queueing import QueueDeadlinePassed

    h = make(clock)
    h.queues.set_limit("local", 1, service_prior_s=0.1)
    await h.arrive_all("holder")
    h.arrive("late", deadline=clock.now() + 1.0)
    await settle()
    clock.time += 5.0  # a jump, with no timer run
    await h.finish("holder")
    assert isinstance(h.failed["late"], QueueDeadlinePassed)
    assert h.queues.snapshot("local").in_flight == 0


async def test_waiting_survives_a_real_event_loop_timer(clock: ManualClock) -> None:
    # The default clock arms real loop timers; a short deadline fires for real.
    from gateway.queueing import QueueDeadlinePassed

    queues = BackendQueues()
    queues.set_limit("local", 1, service_prior_s=0.001)
    holder = await queues.acquire("local", tenant="acme")
    with pytest.raises(QueueDeadlinePassed):
        await queues.acquire("local", tenant="acme", deadline=queues.clock.now() + 0.02)
    holder.release()
    assert queues.snapshot("local").in_flight == 0


async def test_mean_service_time_follows_how_long_slots_are_held(clock: ManualClock) -> None:
    h = make(clock)
    h.queues.set_limit("other", 1, service_prior_s=1.0)
    for _ in range(30):
        ticket = await h.queues.acquire("other", tenant="acme")
        clock.advance(4.0)
        ticket.release()
    assert h.queues.snapshot("other").mean_service_s == pytest.approx(4.0, rel=0.01)


async def test_gather_of_many_requests_never_exceeds_the_limit(clock: ManualClock) -> None:
    queues = BackendQueues()
    queues.set_limit("local", 3)
    busy = peak = 0

    async def request() -> None:
        nonlocal busy, peak
        async with queues.acquire("local", tenant="acme"):
            busy += 1
            peak = max(peak, busy)
            await asyncio.sleep(0)
            busy -= 1

    await asyncio.gather(*(request() for _ in range(50)))
    assert peak == 3
    assert queues.snapshot("local").in_flight == 0
