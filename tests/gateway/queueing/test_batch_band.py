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
