"""Property: any interleaving of arrivals, completions, cancellations, clock jumps and
reloads (limits, batch lines in or out of the background) leaves no slot leaked and no
one queued once everything has finished; no one waits while a slot that counts for it is
free."""

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.queueing import BackendQueues, ShedPolicy
from tests.gateway.queueing.harness import Harness, ManualClock, settle

arrive = st.tuples(st.just("arrive"), st.sampled_from(["acme", "globex", "initech"]),
                   st.sampled_from(["high", "normal", "low", "batch"]),
                   st.none() | st.floats(0.1, 20.0))
finish = st.tuples(st.just("finish"), st.integers(0, 3))
cancel = st.tuples(st.just("cancel"), st.integers(0, 3))
finish_and_cancel = st.tuples(st.just("finish_and_cancel"), st.integers(0, 3),
                              st.integers(0, 3))
advance = st.tuples(st.just("advance"), st.floats(0.0, 8.0))
limit = st.tuples(st.just("limit"), st.integers(1, 4))
background = st.tuples(st.just("background"), st.booleans())
operations = st.lists(arrive | finish | cancel | finish_and_cancel | advance | limit
                      | background, max_size=60)


def held(h: Harness) -> list[str]:
    return [label for label, ticket in h.tickets.items() if not ticket.released]


def release(h: Harness, index: int) -> None:
    holders = held(h)
    if holders:
        h.tickets[holders[index % len(holders)]].release()


def cancel_one(h: Harness, index: int) -> None:
    # Pending means queued, or granted a slot but not yet resumed.
    pending = [task for task in h.tasks.values() if not task.done()]
    if pending:
        pending[index % len(pending)].cancel()


async def run(ops: list[tuple], start_limit: int, max_waiting: int,
              start_background: bool) -> None:
    clock = ManualClock()
    queues = BackendQueues(clock=clock, shed=ShedPolicy(max_waiting=max_waiting))
    queues.set_limit("local", start_limit, service_prior_s=1.0)
    queues.set_background("local", "batch" if start_background else None)
    h = Harness(queues, "local")
    current_limit = start_limit
    for n, op in enumerate(ops):
        match op:
            case ("arrive", tenant, priority, budget):
                deadline = None if budget is None else clock.now() + budget
                h.arrive(f"r{n}", tenant=tenant, priority=priority, deadline=deadline)
            case ("finish", index):
                release(h, index)
            case ("cancel", index):
                cancel_one(h, index)
            case ("finish_and_cancel", index, other):
                release(h, index)  # grants a slot to a waiter...
                cancel_one(h, other)  # ...that may be cancelled before it resumes
            case ("advance", seconds):
                clock.advance(seconds)
            case ("limit", new_limit):
                current_limit = new_limit
                queues.set_limit("local", new_limit)
            case ("background", on):
                queues.set_background("local", "batch" if on else None)
        await settle()
        snapshot = queues.snapshot("local")
        assert snapshot.in_flight == len(held(h))
        assert snapshot.background_in_flight == sum(
            h.tickets[label].background for label in held(h))
        assert snapshot.waiting == sum(not task.done() for task in h.tasks.values())
        waiting = [p for p, n in snapshot.waiting_by_priority.items() if n]
        if waiting:
            counted = snapshot.in_flight
            if waiting[0] != "batch" and snapshot.background == "batch":
                counted -= snapshot.background_in_flight
            assert counted >= current_limit
    for task in h.tasks.values():
        task.cancel()
    await settle()
    for label in held(h):
        h.tickets[label].release()
    await settle()
    snapshot = queues.snapshot("local")
    assert (snapshot.in_flight, snapshot.waiting) == (0, 0)
    assert all(count == 0 for count in snapshot.waiting_by_priority.values())


@settings(max_examples=150, deadline=None)
@given(ops=operations, start_limit=st.integers(1, 3), max_waiting=st.integers(0, 8),
       start_background=st.booleans())
def test_no_slot_leaks_and_queue_drains_after_any_interleaving(
        ops: list[tuple], start_limit: int, max_waiting: int, start_background: bool) -> None:
    asyncio.run(run(ops, start_limit, max_waiting, start_background))
