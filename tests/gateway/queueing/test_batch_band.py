"""The `batch` band (the Batch API's lines) sits below every tenant's: a batch line waiting
for a slot is overtaken by a `low` tenant's request that came later, is the first shed
when the queue is full, and may fill only a quarter of the queue."""

import pytest

from gateway.queueing import PRIORITIES, BackendQueues, Evicted, QueueFull, ShedPolicy
from tests.gateway.queueing.harness import Harness, ManualClock


def make(clock: ManualClock, max_waiting: int = 4) -> Harness:
    queues = BackendQueues(clock=clock, shed=ShedPolicy(max_waiting=max_waiting))
    queues.set_limit("local", 1, service_prior_s=0.01)  # deadlines never bind
    return Harness(queues, "local")


def test_batch_is_the_last_band_served() -> None:
    assert PRIORITIES[-1] == "batch" and PRIORITIES.index("low") == len(PRIORITIES) - 2


async def test_a_waiting_batch_line_is_overtaken_by_a_later_low_request(
        clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    await h.arrive_all("batch-line", tenant="acme", priority="batch")
    await h.arrive_all("low", tenant="bulk", priority="low")
    await h.finish("holder")
    await h.finish("low")
    assert h.granted == ["holder", "low", "batch-line"]


async def test_a_full_queue_sheds_the_batch_line_before_any_low_request(
        clock: ManualClock) -> None:
    h = make(clock, max_waiting=4)  # low may fill 2 places, batch 1
    await h.arrive_all("holder")
    await h.arrive_all("batch-line", priority="batch")
    await h.arrive_all("low-1", "low-2", tenant="bulk", priority="low")
    assert isinstance(h.failed["batch-line"], Evicted)
    assert "low-1" not in h.failed and "low-2" not in h.failed
    assert h.queues.snapshot("local").waiting_by_priority == {
        "high": 0, "normal": 0, "low": 2, "batch": 0}


async def test_batch_lines_may_fill_only_a_quarter_of_the_queue(clock: ManualClock) -> None:
    h = make(clock, max_waiting=8)
    await h.arrive_all("holder")
    await h.arrive_all("batch-1", "batch-2", priority="batch")
    with pytest.raises(QueueFull):
        await h.queues.acquire("local", tenant="acme", priority="batch")
    await h.arrive_all("low-1", "low-2", priority="low")  # low still has its half
    assert h.queues.snapshot("local").waiting_by_priority["low"] == 2
    assert not h.failed


def make_background(clock: ManualClock, limit: int = 2) -> Harness:
    """A backend whose scheduler runs batch lines in the background."""
    queues = BackendQueues(clock=clock, shed=ShedPolicy(max_waiting=8))
    queues.set_limit("local", limit, service_prior_s=0.01)
    queues.set_background("local", "batch")
    return Harness(queues, "local")


async def test_batch_lines_in_the_background_never_make_an_interactive_request_wait(
        clock: ManualClock) -> None:
    h = make_background(clock, limit=2)
    await h.arrive_all("line-1", "line-2", priority="batch")
    await h.arrive_all("normal-1", "normal-2", tenant="web")
    assert h.granted == ["line-1", "line-2", "normal-1", "normal-2"]
    snapshot = h.queues.snapshot("local")
    assert (snapshot.in_flight, snapshot.background_in_flight, snapshot.waiting) == (4, 2, 0)


async def test_interactive_requests_still_keep_to_the_limit_among_themselves(
        clock: ManualClock) -> None:
    h = make_background(clock, limit=2)
    await h.arrive_all("line", priority="batch")
    await h.arrive_all("normal-1", "normal-2", "normal-3", tenant="web")
    assert h.granted == ["line", "normal-1", "normal-2"]
    await h.finish("line")  # a background slot freed is no interactive slot
    assert "normal-3" not in h.granted
    await h.finish("normal-1")
    assert h.granted[-1] == "normal-3"


async def test_a_batch_line_still_counts_every_slot_in_use(clock: ManualClock) -> None:
    h = make_background(clock, limit=2)
    await h.arrive_all("normal-1", "normal-2", tenant="web")
    await h.arrive_all("line", priority="batch")
    assert "line" not in h.granted  # it waits: it would be a third request running
    await h.finish("normal-1")
    assert h.granted[-1] == "line"


async def test_a_waiting_batch_line_does_not_hold_back_an_interactive_arrival(
        clock: ManualClock) -> None:
    h = make_background(clock, limit=1)
    await h.arrive_all("line-1", priority="batch")
    await h.arrive_all("line-2", priority="batch")  # waits behind line-1
    await h.arrive_all("normal", tenant="web")
    assert h.granted == ["line-1", "normal"]


async def test_background_hold_times_leave_the_service_estimate_alone(
        clock: ManualClock) -> None:
    h = make_background(clock)
    before = h.queues.snapshot("local").mean_service_s
    await h.arrive_all("line", priority="batch")
    clock.advance(30.0)  # paused behind interactive work for half a minute
    await h.finish("line")
    assert h.queues.snapshot("local").mean_service_s == before


async def test_a_line_granted_before_the_band_left_the_background_is_released_as_granted(
        clock: ManualClock) -> None:
    h = make_background(clock, limit=1)
    await h.arrive_all("line", priority="batch")
    h.queues.set_background("local", None)  # a reload turned background slots off
    await h.arrive_all("normal", tenant="web")
    assert h.granted == ["line"]  # the line now counts against everyone
    await h.finish("line")
    assert h.granted == ["line", "normal"]
    assert h.queues.snapshot("local").background_in_flight == 0
