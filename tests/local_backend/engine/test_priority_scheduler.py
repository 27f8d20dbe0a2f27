"""The scheduler by priority: admission order, whom preemption picks, aging, doomed work.

Plain values only: a block manager, sequences with a band and a deadline, and the
scheduler's `schedule(now)` as the engine calls it, without a model.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from local_backend.engine.block_manager import BlockManager
from local_backend.engine.params import SamplingParams
from local_backend.engine.priority import SchedulingPolicy
from local_backend.engine.scheduler import Batch, Scheduler
from local_backend.engine.sequence import Sequence, Status, Timings

BATCH = 3  # the gateway's batch band, background by default


def seq(name: str, *, band: int = 1, deadline: float | None = None, arrival: float = 0.0,
        prompt: int = 4, max_tokens: int = 16) -> Sequence:
    return Sequence(name, list(range(100, 100 + prompt)), SamplingParams(max_tokens=max_tokens),
                    Timings(arrival=arrival), deadline=deadline, priority=band)


def scheduler(*, seqs: int = 8, blocks: int = 200, mode: str = "priority",
              aging_s: float = 10.0) -> Scheduler:
    manager = BlockManager(blocks, 4, prefix_caching=False)
    policy = SchedulingPolicy("priority" if mode == "priority" else "fcfs", aging_s)
    return Scheduler(manager, max_num_seqs=seqs, max_num_batched_tokens=64, policy=policy)


def step(s: Scheduler, now: float) -> Batch:
    """One engine step: schedule, then every scheduled token counts as computed and a
    sequence that finished its prompt writes one token."""
    batch = s.schedule(now)
    for sq, n in zip(batch.seqs, batch.num_new, strict=True):
        sq.num_computed += n
        if sq.num_computed == sq.num_tokens:
            sq.output_ids.append(7)
    return batch


def names(seqs: list[Sequence]) -> list[str]:
    return [s.request_id for s in seqs]


def test_waiting_sequences_are_admitted_by_band_then_deadline_then_arrival() -> None:
    s = scheduler(seqs=1)
    for sq in (seq("low", band=2, arrival=0.0), seq("normal-late", band=1, arrival=0.1),
               seq("normal-due", band=1, deadline=50.0, arrival=0.2),
               seq("high", band=0, arrival=0.3), seq("normal-early", band=1, arrival=0.05)):
        s.add(sq)
    order = []
    for t in range(5):
        batch = step(s, 1.0 + t * 0.001)
        order.append(batch.seqs[-1].request_id)
        s.finish(batch.seqs[-1], "stop")
    assert order == ["high", "normal-due", "normal-early", "normal-late", "low"]


def test_fcfs_admits_by_arrival_whatever_the_band() -> None:
    s = scheduler(seqs=1, mode="fcfs")
    for name, band in (("a", 2), ("b", 0), ("c", 1)):
        s.add(seq(name, band=band))
    order = []
    for t in range(3):
        batch = step(s, float(t))
        order.append(batch.seqs[-1].request_id)
        s.finish(batch.seqs[-1], "stop")
    assert order == ["a", "b", "c"]


def test_a_better_band_preempts_the_worst_running_when_the_batch_is_full() -> None:
    s = scheduler(seqs=3)
    running = [seq("n1", band=1), seq("low-soon", band=2, deadline=30.0),
               seq("low-late", band=2, deadline=90.0)]
    for sq in running:
        s.add(sq)
    step(s, 0.0)
    high = seq("high", band=0, arrival=1.0)
    s.add(high)
    batch = step(s, 1.0)
    assert names(batch.preempted) == ["low-late"]  # lowest band, latest deadline among them
    assert high.status is Status.RUNNING and high in batch.seqs
    assert s.bands[2].preemptions == 1 and s.num_preemptions == 1
    assert running[2].status is Status.WAITING and running[2].block_table == []


def test_a_batch_line_is_preempted_before_a_low_sequence_however_old_it_is() -> None:
    # band 3: the gateway's `batch` band (the Batch API's lines), below tenants' `low` (2)
    s = scheduler(seqs=2)
    batch_line = seq("batch-line", band=3, deadline=5.0, arrival=0.0)
    s.add(batch_line)
    step(s, 0.5)
    low = seq("low", band=2, arrival=0.5)
    s.add(low)
    step(s, 1.0)
    s.add(seq("normal", band=1, arrival=2.0))
    batch = step(s, 2.0)
    assert names(batch.preempted) == ["batch-line"]
    assert low.status is Status.RUNNING and s.bands[3].preemptions == 1
    assert 2 not in s.bands or s.bands[2].preemptions == 0


def test_a_low_sequence_is_admitted_before_an_earlier_batch_line() -> None:
    s = scheduler(seqs=1)
    s.add(seq("batch-line", band=3, arrival=0.0))
    s.add(seq("low", band=2, arrival=0.5))
    assert names(step(s, 1.0).seqs) == ["low"]


def test_a_better_band_preempts_when_blocks_are_short() -> None:
    # 20 blocks of 4 tokens, watermark 1: two 32-token prompts fill 16; a third needs 8.
    s = scheduler(seqs=8, blocks=20)
    low = seq("low", band=2, prompt=32)
    s.add(seq("normal", band=1, prompt=32))
    s.add(low)
    step(s, 0.0)
    high = seq("high", band=0, prompt=32, arrival=1.0)
    s.add(high)
    batch = step(s, 1.0)
    assert names(batch.preempted) == ["low"]
    assert high.status is Status.RUNNING


def test_an_equal_or_worse_band_never_preempts() -> None:
    s = scheduler(seqs=2)
    s.add(seq("a", band=1))
    s.add(seq("b", band=1))
    step(s, 0.0)
    s.add(seq("same", band=1, deadline=2.0, arrival=1.0))  # an earlier deadline is not enough
    s.add(seq("worse", band=3, arrival=1.0))
    batch = step(s, 1.0)
    assert batch.preempted == []
    assert names(s.running) == ["a", "b"]


def test_a_preempted_sequence_returns_before_later_ones_of_its_band() -> None:
    s = scheduler(seqs=2)
    s.add(seq("low-1", band=2))
    s.add(seq("low-2", band=2, arrival=0.1))
    step(s, 0.0)
    s.add(seq("low-3", band=2, arrival=0.5))
    high = seq("high", band=0, arrival=1.0)
    s.add(high)
    step(s, 1.0)
    s.finish(high, "stop")
    batch = step(s, 2.0)
    assert names(batch.seqs) == ["low-1", "low-2"]  # low-2 (preempted) before low-3


def test_aging_raises_a_waiting_sequence_one_band_per_period() -> None:
    s = scheduler(seqs=1, aging_s=5.0)
    s.add(seq("holder", band=0))
    step(s, 0.0)
    low = seq("low", band=3)
    s.add(low)
    step(s, 4.9)
    assert low.band == 3
    step(s, 5.0)
    assert low.band == 2
    step(s, 12.0)
    assert low.band == 1
    step(s, 100.0)
    assert low.band == 0  # never above the top band
    assert low.priority == 3  # metrics keep the band it asked for


def test_an_aged_sequence_overtakes_later_arrivals_of_a_better_band() -> None:
    s = scheduler(seqs=1, aging_s=5.0)
    s.add(seq("holder", band=0))
    step(s, 0.0)
    s.add(seq("low", band=2, arrival=0.0))
    s.add(seq("normal", band=1, arrival=9.0))
    step(s, 10.0)  # low has waited two periods: band 0, ahead of normal
    holder = s.running[0]
    s.finish(holder, "stop")
    batch = step(s, 10.0)
    assert names(batch.seqs) == ["low"]


def test_no_aging_under_fcfs() -> None:
    s = scheduler(seqs=1, mode="fcfs", aging_s=1.0)
    s.add(seq("holder"))
    step(s, 0.0)
    low = seq("low", band=2)
    s.add(low)
    step(s, 50.0)
    assert low.band == 2


def test_a_request_that_cannot_finish_by_its_deadline_is_refused_before_prefill() -> None:
    s = scheduler()
    s.pace.step_s, s.pace.completion_tokens = 0.1, 20.0  # ~2 s of work per request
    doomed = seq("doomed", deadline=11.0, max_tokens=100)
    fits = seq("fits", deadline=13.0, max_tokens=100)
    short = seq("short", deadline=11.0, max_tokens=3)  # asks for few tokens: fits
    for sq in (doomed, fits, short):
        s.add(sq)
    assert names(s.overdue(10.0)) == ["doomed"]
    assert s.bands[1].doomed == 1


def test_nothing_is_judged_doomed_before_the_pace_is_known() -> None:
    s = scheduler()
    s.add(seq("a", deadline=10.001, max_tokens=10_000))
    assert s.overdue(10.0) == []


def test_a_started_sequence_is_never_judged_doomed_only_ended_at_its_deadline() -> None:
    s = scheduler(seqs=1)
    started = seq("started", deadline=11.0, max_tokens=100)
    s.add(started)
    step(s, 10.0)
    s.pace.step_s, s.pace.completion_tokens = 0.1, 50.0
    assert s.overdue(10.5) == []
    assert s.overdue(11.0) == [started]


def test_time_waited_is_counted_per_band_asked_for() -> None:
    s = scheduler(seqs=2)
    s.add(seq("high", band=0, arrival=1.0))
    s.add(seq("low", band=2, arrival=0.0))
    step(s, 3.0)
    stats = {b.band: b for b in s.band_stats()}
    assert stats[0].admitted == 1 and stats[0].waited_s == 2.0
    assert stats[2].waited_s == 3.0 and stats[2].running == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12), st.integers(0, 6)),
                min_size=1, max_size=14),
       st.integers(1, 4), st.integers(12, 40))
def test_preemption_never_takes_a_better_band_for_a_worse_and_everyone_finishes(
        arrivals: list[tuple[int, int, int]], max_seqs: int, num_blocks: int) -> None:
    s = Scheduler(BlockManager(num_blocks, 4, prefix_caching=False), max_num_seqs=max_seqs,
                  max_num_batched_tokens=16, policy=SchedulingPolicy("priority", 3.0))
    pending = [seq(f"r{i}", band=b, prompt=p, arrival=float(t), max_tokens=4)
               for i, (b, p, t) in enumerate(arrivals)]
    pending.sort(key=lambda sq: sq.timings.arrival)
    finished = 0
    for t in range(400):
        now = float(t)
        while pending and pending[0].timings.arrival <= now:
            s.add(pending.pop(0))
        before = {sq.request_id: sq.band for sq in s.waiting}
        batch = step(s, now)
        # background work (band 3) never shares a step with a better band's
        assert len({sq.band >= BATCH for sq in batch.seqs}) <= 1
        for victim in batch.preempted:  # whoever displaced it was of a better band
            admitted = [sq for sq in batch.seqs if before.get(sq.request_id) is not None]
            assert all(before[sq.request_id] <= victim.band for sq in admitted)
            # and nothing of a worse band kept running while it was preempted
            assert all(sq.band <= victim.band for sq in s.running)
        for sq in list(s.running):
            if len(sq.output_ids) >= sq.params.max_tokens:
                s.finish(sq, "length")
                finished += 1
        if not pending and not s.has_work():
            break
    assert finished == len(arrivals)  # nobody starves, none is lost
    assert s.blocks.num_free == num_blocks


def test_a_full_queue_lets_a_better_band_in_and_sheds_the_worst_not_yet_started() -> None:
    s = scheduler(seqs=1)
    s.add(seq("running", band=2))
    step(s, 0.0)
    s.add(seq("normal", band=1, arrival=1.0))
    s.add(seq("low-early", band=2, arrival=1.0))
    s.add(seq("low-late", band=2, arrival=2.0))
    assert not s.outranks_waiting(2) and s.outranks_waiting(1) and s.outranks_waiting(0)
    s.add(seq("high", band=0, arrival=3.0))
    assert names(s.shed(3)) == ["low-late"] and names(s.shed(2)) == ["low-early", "low-late"]
    assert s.shed(4) == []


def test_fcfs_lets_nobody_into_a_full_queue() -> None:
    s = scheduler(mode="fcfs")
    s.add(seq("low", band=2))
    assert not s.outranks_waiting(0)


def test_a_displaced_sequence_goes_back_ahead_of_worse_bands_in_the_same_step() -> None:
    s = scheduler(seqs=2)
    s.add(seq("normal", band=1))
    s.add(seq("low", band=2))
    step(s, 0.0)
    s.add(seq("high", band=0, arrival=1.0))
    s.add(seq("worst", band=3, arrival=1.0))
    step(s, 1.0)
    assert names(s.waiting) == ["low", "worst"]


def test_background_work_is_admitted_only_when_nothing_better_runs_or_waits() -> None:
    s = scheduler()
    s.add(seq("normal", band=1))
    s.add(seq("batch-line", band=BATCH))
    assert names(step(s, 0.0).seqs) == ["normal"]
    s.finish(s.running[0], "stop")
    batch = step(s, 1.0)
    assert names(batch.seqs) == ["batch-line"] and batch.background


def test_a_running_background_sequence_pauses_while_better_work_runs_and_keeps_its_blocks(
) -> None:
    s = scheduler()
    line = seq("batch-line", band=BATCH)
    s.add(line)
    step(s, 0.0)
    blocks = list(line.block_table)
    s.add(seq("low", band=2, arrival=1.0))
    for t in (1.0, 1.1, 1.2):
        batch = step(s, t)
        assert names(batch.seqs) == ["low"] and not batch.background
    assert line.status is Status.RUNNING and line.block_table == blocks
    assert batch.preempted == []
    s.finish(s.running[0], "stop")
    assert names(step(s, 1.3).seqs) == ["batch-line"]


def test_a_step_of_background_work_alone_computes_at_most_its_token_cap() -> None:
    manager = BlockManager(200, 4, prefix_caching=False)
    policy = SchedulingPolicy("priority", 10.0, background_step_tokens=8)
    s = Scheduler(manager, max_num_seqs=8, max_num_batched_tokens=64, policy=policy)
    line = seq("batch-line", band=BATCH, prompt=20)
    s.add(line)
    assert [step(s, float(t)).num_new for t in range(3)] == [[8], [8], [4]]
    assert line.output_ids == [7]  # prefilled in three short steps, then its first token
    s.add(seq("normal", band=1, prompt=20, arrival=3.0))
    assert step(s, 3.0).num_new == [20]  # better work takes the step's whole budget


def test_a_background_sequence_paused_for_the_aging_period_rises_and_runs_with_better_work(
) -> None:
    s = scheduler(aging_s=10.0)
    line = seq("batch-line", band=BATCH)
    s.add(line)
    step(s, 0.0)
    s.add(seq("low", band=2, arrival=0.5, max_tokens=1000))
    assert names(step(s, 5.0).seqs) == ["low"]  # paused 5 s since its last step
    assert names(step(s, 9.9).seqs) == ["low"]
    step(s, 10.0)  # paused 10 s: it rises to band 2 ...
    assert line.band == 2
    assert sorted(names(step(s, 10.1).seqs)) == ["batch-line", "low"]  # ... and shares steps


def test_no_band_is_background_under_fcfs_or_when_the_policy_names_none() -> None:
    for policy in (SchedulingPolicy("fcfs"), SchedulingPolicy("priority", background_band=None)):
        s = Scheduler(BlockManager(200, 4, prefix_caching=False), max_num_seqs=8,
                      max_num_batched_tokens=64, policy=policy)
        s.add(seq("batch-line", band=BATCH))
        step(s, 0.0)
        s.add(seq("normal", band=1, arrival=1.0))
        batch = step(s, 1.0)
        assert sorted(names(batch.seqs)) == ["batch-line", "normal"] and not batch.background

