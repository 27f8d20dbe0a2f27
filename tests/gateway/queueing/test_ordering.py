"""Who is served next: priority band, then fair share across tenants, then earliest deadline."""

import asyncio
from collections import Counter

from gateway.queueing import BackendQueues
from tests.gateway.queueing.harness import Harness, ManualClock, settle


def make(clock: ManualClock, weights: dict[str, float] | None = None) -> Harness:
    queues = BackendQueues(clock=clock, tenant_weights=weights)
    queues.set_limit("local", 1, service_prior_s=0.01)  # deadlines below never bind
    return Harness(queues, "local")


async def serve(h: Harness, count: int) -> None:
    """Complete the oldest held slot `count` times."""
    for _ in range(count):
        label = next(lbl for lbl in h.granted if not h.tickets[lbl].released)
        await h.finish(label)


async def test_higher_priority_band_is_served_first(clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    await h.arrive_all("low", priority="low")
    await h.arrive_all("normal", priority="normal")
    await h.arrive_all("high", priority="high")
    await serve(h, 3)
    assert h.granted == ["holder", "high", "normal", "low"]


async def test_earliest_deadline_is_served_first_within_a_band(clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    now = clock.now()
    h.arrive("relaxed", deadline=now + 30)
    h.arrive("no-deadline")
    h.arrive("urgent", deadline=now + 5)
    h.arrive("soon", deadline=now + 10)
    await settle()
    await serve(h, 4)
    assert h.granted == ["holder", "urgent", "soon", "relaxed", "no-deadline"]


async def test_earliest_deadline_wins_between_tenants_with_equal_share(
        clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    now = clock.now()
    h.arrive("acme-relaxed", tenant="acme", deadline=now + 30)
    h.arrive("globex-urgent", tenant="globex", deadline=now + 5)
    await settle()
    await serve(h, 2)
    assert h.granted == ["holder", "globex-urgent", "acme-relaxed"]


async def test_priority_outranks_an_earlier_deadline(clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    h.arrive("normal-urgent", deadline=clock.now() + 1)
    h.arrive("high-relaxed", priority="high", deadline=clock.now() + 60)
    await settle()
    await serve(h, 2)
    assert h.granted == ["holder", "high-relaxed", "normal-urgent"]


async def test_tenant_with_ten_times_the_backlog_does_not_starve_another(
        clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    for i in range(100):
        h.arrive(f"heavy-{i}", tenant="heavy")
    for i in range(10):
        h.arrive(f"light-{i}", tenant="light")
    await settle()
    await serve(h, 20)
    served = Counter(label.split("-")[0] for label in h.granted[1:])
    assert served == {"heavy": 10, "light": 10}


async def test_closed_loop_tenants_at_ten_to_one_demand_each_get_their_share(
        clock: ManualClock) -> None:
    """Ten clients of one tenant and one of another keep a 1-slot backend busy."""
    queues = BackendQueues(clock=clock)
    queues.set_limit("local", 1)
    served: Counter[str] = Counter()
    enough = asyncio.Event()

    async def client(tenant: str) -> None:
        while not enough.is_set():
            async with queues.acquire("local", tenant=tenant):
                served[tenant] += 1
                if sum(served.values()) >= 400:
                    enough.set()
                await asyncio.sleep(0)  # the upstream call

    clients = [asyncio.create_task(client("heavy")) for _ in range(10)]
    clients.append(asyncio.create_task(client("light")))
    await enough.wait()
    await asyncio.gather(*clients)
    # Equal weights: the light tenant gets half the throughput it asks for; the
    # heavy one everything else (0.5 each, give or take a rotation at the edges).
    total = sum(served.values())
    assert served["light"] / total >= 0.45
    assert served["heavy"] / total >= 0.45


async def test_tenant_weights_divide_throughput_in_proportion(clock: ManualClock) -> None:
    h = make(clock, weights={"gold": 3.0, "bronze": 1.0})
    await h.arrive_all("holder")
    for i in range(40):
        h.arrive(f"gold-{i}", tenant="gold")
        h.arrive(f"bronze-{i}", tenant="bronze")
    await settle()
    await serve(h, 40)
    served = Counter(label.split("-")[0] for label in h.granted[1:])
    assert served == {"gold": 30, "bronze": 10}


async def test_tenant_returning_from_idle_gets_no_banked_credit(clock: ManualClock) -> None:
    h = make(clock)
    await h.arrive_all("holder")
    for i in range(10):
        h.arrive(f"busy-{i}", tenant="busy")
    await settle()
    await serve(h, 6)  # "idle" sent nothing meanwhile
    for i in range(5):
        h.arrive(f"idle-{i}", tenant="idle")
    await settle()
    await serve(h, 6)
    # Alternates from the moment it arrives, rather than taking 5 slots in a row.
    assert [label.split("-")[0] for label in h.granted[7:13]] == ["idle", "busy"] * 3
