"""The engine tells a client which of its named prefixes it holds: a name is stored
once every token block it needs is cached, and evicted the moment one of them leaves;
the log is numbered, bounded, and resets a client that fell behind or knew another life."""

from __future__ import annotations

from local_backend.engine.block_manager import BlockManager
from local_backend.engine.params import SamplingParams
from local_backend.engine.prefix_events import PrefixEvents
from local_backend.engine.sequence import Sequence, Timings


def seq(name: str, tokens: list[int], tags: tuple[tuple[int, int], ...] = ()) -> Sequence:
    return Sequence(name, tokens, SamplingParams(), Timings(arrival=0.0), prefix_tags=tags)


def run(manager: BlockManager, s: Sequence) -> None:
    assert manager.allocate(s)
    s.num_computed = s.num_tokens
    manager.commit(s)
    manager.release(s)


def held(events: PrefixEvents) -> set[int]:
    return set(events.since(0, None).held or ())


def test_a_tag_is_stored_once_its_blocks_are_computed() -> None:
    events = PrefixEvents()
    manager = BlockManager(num_blocks=8, block_size=4, events=events)
    s = seq("a", list(range(10)), tags=((111, 1), (222, 2)))
    assert manager.allocate(s)
    s.num_computed = 4  # a first chunk of the prefill: one full block
    manager.commit(s)
    assert held(events) == {111}
    s.num_computed = 10
    manager.commit(s)
    assert held(events) == {111, 222}
    page = events.since(0, events.epoch)
    assert page.events == [(True, 111), (True, 222)] and page.next == 2


def test_evicting_any_block_a_tag_needs_evicts_the_tag_and_only_those() -> None:
    events = PrefixEvents()
    manager = BlockManager(num_blocks=4, block_size=4, events=events)
    run(manager, seq("a", list(range(9)), tags=((1, 1), (2, 2))))  # 2 full blocks cached
    assert held(events) == {1, 2}
    seen = events.since(0, events.epoch).next
    # another prompt takes three of the four blocks: the free ones, then `a`'s tail
    run(manager, seq("b", [100 + t for t in range(9)]))
    page = events.since(seen, events.epoch)
    assert page.events == [(False, 2)]  # its second block left; tag 1 needs only the first
    assert held(events) == {1}
    run(manager, seq("c", [200 + t for t in range(9)]))  # and now its head
    assert held(events) == set()


def test_a_tag_whose_blocks_are_gone_before_it_is_reported_is_reported_evicted() -> None:
    events = PrefixEvents()
    events.stored(7, [1, 2], cached=lambda block: block == 1)
    assert events.since(0, events.epoch).events == [(False, 7)]
    events.not_held(8)
    assert events.since(1, events.epoch).events == [(False, 8)]


def test_the_tags_kept_are_bounded_and_a_dropped_one_is_reported_evicted() -> None:
    events = PrefixEvents(max_tags=2)
    for tag in (1, 2, 3):
        events.stored(tag, [tag], cached=lambda _: True)
    assert held(events) == {2, 3}
    assert events.since(0, events.epoch).events[-1] == (False, 1)


def test_a_client_behind_the_log_or_from_another_life_is_reset_with_what_is_held() -> None:
    events = PrefixEvents(max_events=3)
    for tag in range(5):
        events.stored(tag, [tag], cached=lambda _: True)
    behind = events.since(0, events.epoch)
    assert behind.reset and set(behind.held or ()) == {0, 1, 2, 3, 4} and behind.next == 5
    assert events.since(3, events.epoch).events == [(True, 3), (True, 4)]  # events 4, 5
    other_life = events.since(5, "an earlier epoch")
    assert other_life.reset and other_life.next == 5
    assert events.since(5, events.epoch).events == []
    assert events.since(6, events.epoch).reset  # a number from the future: reset too
