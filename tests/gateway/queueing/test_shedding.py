"""Admission at the door: bounded queue, predicted-wait check, low shed first."""

import pytest

from gateway.queueing import (
    BackendQueues,
    Evicted,
    QueueFull,
    ShedPolicy,
    WouldMissDeadline,
)
from gateway.queueing.shedding import ArrivalRate
from tests.gateway.queueing.harness import Harness, ManualClock, settle


def make(clock: ManualClock, max_waiting: int = 4, service_s: float = 2.0) -> Harness:
    queues = BackendQueues(clock=clock, shed=ShedPolicy(max_waiting=max_waiting))
    queues.set_limit("local", 1, service_prior_s=service_s)
    return Harness(queues, "local")


async def test_low_priority_may_fill_only_half_the_queue(clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    await h.arrive_all("low-1", "low-2", priority="low")
    with pytest.raises(QueueFull) as refused:
        await h.queues.acquire("local", tenant="acme", priority="low")
    assert refused.value.retry_after_s >= 1
    await h.arrive_all("normal-1", "normal-2")
    assert h.queues.snapshot("local").waiting == 4


async def test_higher_priority_arrival_evicts_the_newest_low_waiter_when_full(
        clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    await h.arrive_all("low-old", "low-new", priority="low")
    await h.arrive_all("normal-1", "normal-2")
    await h.arrive_all("high", priority="high")
    assert isinstance(h.failed["low-new"], Evicted)
    assert "low-old" not in h.failed
    snapshot = h.queues.snapshot("local")
    assert snapshot.waiting_by_priority == {"high": 1, "normal": 2, "low": 1, "batch": 0}
    assert snapshot.counters.evicted == 1


async def test_normal_arrival_evicts_low_before_any_normal(clock: ManualClock) -> None:
    h = make(clock, max_waiting=2)
    await h.arrive_all("holder")
    await h.arrive_all("low", priority="low")
    await h.arrive_all("normal-1", "normal-2")
    assert isinstance(h.failed["low"], Evicted)
    assert h.queues.snapshot("local").waiting_by_priority["normal"] == 2


async def test_arrival_is_refused_when_full_of_equal_or_higher_priority(
        clock: ManualClock) -> None:
    h = make(clock, max_waiting=2)
    await h.arrive_all("holder")
    await h.arrive_all("high-1", "high-2", priority="high")
    with pytest.raises(QueueFull):
        await h.queues.acquire("local", tenant="acme", priority="normal")
    with pytest.raises(QueueFull):
        await h.queues.acquire("local", tenant="acme", priority="high")
    assert h.queues.snapshot("local").counters.rejected_full == 2


async def test_request_is_refused_at_once_when_predicted_wait_breaks_its_budget(
        clock: ManualClock) -> None:
    h = make(clock, service_s=2.0)
    await h.arrive_all("holder")
    await h.arrive_all("w1", "w2")  # a newcomer needs 3 releases: ~6 s
    with pytest.raises(WouldMissDeadline) as refused:
        await h.queues.acquire("local", tenant="acme", deadline=clock.now() + 5.0)
    assert refused.value.predicted_wait_s == pytest.approx(6.0)
    assert refused.value.retry_after_s == 6
    assert h.queues.snapshot("local").waiting == 2


async def test_predicted_wait_counts_only_waiters_of_equal_or_higher_priority(
        clock: ManualClock) -> None:
    h = make(clock, max_waiting=16, service_s=2.0)
    await h.arrive_all("holder")
    await h.arrive_all("l1", "l2", "l3", priority="low")
    await h.arrive_all("n1")
    clock.advance(120.0)  # the arrival-rate estimate forgets the burst; nothing moves
    assert h.queues.predicted_wait_s("local", "high") == pytest.approx(2.0)
    assert h.queues.predicted_wait_s("local", "normal") == pytest.approx(4.0)
    assert h.queues.predicted_wait_s("local", "low") == pytest.approx(10.0)


async def test_predicted_wait_of_a_lower_band_grows_with_higher_band_traffic(
        clock: ManualClock) -> None:
    h = make(clock, service_s=0.2)
    for _ in range(100):  # a high request every 0.4 s holding the slot 0.2 s: half the backend
        ticket = await h.queues.acquire("local", tenant="acme", priority="high")
        clock.advance(0.2)
        ticket.release()
        clock.advance(0.2)
    await h.arrive_all("holder")
    high = h.queues.predicted_wait_s("local", "high")
    normal = h.queues.predicted_wait_s("local", "normal")
    assert high == pytest.approx(0.2)
    assert normal == pytest.approx(0.4, rel=0.1)  # 0.2 s / (1 − ~0.5 taken by high)


async def test_predicted_wait_is_zero_while_a_slot_is_free(clock: ManualClock) -> None:
    h = make(clock)
    h.queues.set_limit("local", 4)
    await h.arrive_all("a", "b", "c")
    assert h.queues.predicted_wait_s("local") == 0.0
    await settle()


async def test_at_twice_capacity_low_is_shed_while_every_high_is_served(
        clock: ManualClock) -> None:
    h = make(clock, max_waiting=8)
    await h.arrive_all("holder")
    for i in range(50):  # per service time: one high and one low arrive, one finishes
        await h.arrive_all(f"high-{i}", priority="high")
        await h.arrive_all(f"low-{i}", priority="low")
        await h.finish(next(lbl for lbl in h.granted if not h.tickets[lbl].released))
    assert not [label for label in h.failed if label.startswith("high")]
    assert sum(label.startswith("low") for label in h.failed) >= 40
    assert h.queues.snapshot("local").waiting_by_priority["low"] <= 4


async def test_request_is_refused_when_budget_covers_the_mean_wait_but_not_its_spread(
        clock: ManualClock) -> None:
    h = make(clock, service_s=2.0)
    await h.arrive_all("holder")
    await h.arrive_all("w1", "w2")  # mean 6 s; three releases spread it to ~11.7 s
    with pytest.raises(WouldMissDeadline, match=r"up to 11\.7"):
        await h.queues.acquire("local", tenant="acme", deadline=clock.now() + 8.0)


def test_arrival_rate_estimate_is_unbiased_from_the_first_second() -> None:
    rate = ArrivalRate(window_s=2.0)
    for i in range(20):  # 10 per second for 2 s
        rate.add(i * 0.1)
    assert rate.per_s(2.0) == pytest.approx(10.0, rel=0.1)
    assert rate.per_s(30.0) < 0.01  # and forgets
