"""Block accounting: reference counts, prefix sharing, LRU reuse of freed cached blocks."""

from __future__ import annotations

from local_backend.engine.block_manager import BlockManager
from local_backend.engine.params import SamplingParams
from local_backend.engine.sequence import Sequence, Timings


def seq(name: str, tokens: list[int]) -> Sequence:
    return Sequence(name, tokens, SamplingParams(), Timings(arrival=0.0))


def computed(manager: BlockManager, s: Sequence) -> None:
    """What the engine does after a step that computed every token of `s`."""
    s.num_computed = s.num_tokens
    manager.commit(s)


def test_allocation_takes_blocks_for_every_prompt_token() -> None:
    manager = BlockManager(num_blocks=10, block_size=4)
    s = seq("a", list(range(9)))
    assert manager.allocate(s)
    assert len(s.block_table) == 3
    assert manager.num_free == 7


def test_release_returns_every_block() -> None:
    manager = BlockManager(num_blocks=10, block_size=4)
    s = seq("a", list(range(9)))
    manager.allocate(s)
    manager.release(s)
    assert manager.num_free == 10 and s.block_table == []


def test_shared_prefix_blocks_are_referenced_not_copied() -> None:
    manager = BlockManager(num_blocks=10, block_size=4)
    a = seq("a", list(range(10)))
    manager.allocate(a)
    computed(manager, a)
    b = seq("b", [*range(8), 99, 98, 97])
    manager.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.num_computed == 8
    assert manager.ref_counts[a.block_table[0]] == 2
    manager.release(a)
    manager.release(b)
    assert manager.num_free == 10


def test_freed_blocks_stay_cached_until_reused() -> None:
    manager = BlockManager(num_blocks=4, block_size=4)
    a = seq("a", list(range(8)))
    manager.allocate(a)
    computed(manager, a)
    manager.release(a)
    again = seq("again", [*range(8), 5])
    manager.allocate(again)
    assert again.num_computed == 8
    manager.release(again)


def test_eviction_takes_a_prefix_tail_first_and_forgets_its_hash() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    a = seq("a", [1, 2, 3, 4, 5])
    assert manager.allocate(a)
    computed(manager, a)
    manager.release(a)
    b = seq("b", [9, 9, 8, 8, 7])  # three blocks: the unused one, the partial one, then [3, 4]
    assert manager.allocate(b)
    manager.release(b)
    c = seq("c", [1, 2, 3, 4, 5])
    assert manager.allocate(c)
    assert c.num_computed == 2  # [1, 2] survived; [3, 4] was evicted
    manager.release(c)


def test_admission_refuses_when_blocks_run_short() -> None:
    manager = BlockManager(num_blocks=4, block_size=4)
    assert not manager.allocate(seq("big", list(range(16))))  # the watermark keeps one back
    assert manager.num_free == 4


def test_append_grows_a_sequence_one_block_at_a_time() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    s = seq("a", [1, 2])
    manager.allocate(s)
    computed(manager, s)
    s.output_ids.append(3)
    assert manager.append(s, 1)
    assert len(s.block_table) == 2
    manager.release(s)


def colliding(parent: int | None, tokens: list[int]) -> int:
    """A forced collision: every block of every prompt gets the same hash."""
    return 7


def blind_to_the_prefix(parent: int | None, tokens: list[int]) -> int:
    """Blocks with equal tokens collide whatever came before them."""
    return hash(tuple(tokens))


def test_prompts_whose_hashes_collide_share_no_blocks() -> None:
    manager = BlockManager(num_blocks=16, block_size=4, hash_fn=colliding)
    tenant_a = seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    manager.allocate(tenant_a)
    computed(manager, tenant_a)
    tenant_b = seq("b", [11, 12, 13, 14, 15, 16, 17, 18, 19])
    manager.allocate(tenant_b)
    assert tenant_b.num_computed == 0
    assert not set(tenant_b.block_table) & set(tenant_a.block_table)
    # The real prefix still hits (the first block; the second's hash names the first block).
    again = seq("c", [1, 2, 3, 4, 5, 6, 7, 8, 10])
    manager.allocate(again)
    assert again.block_table[0] == tenant_a.block_table[0] and again.num_computed == 4


def test_a_block_with_equal_tokens_after_a_different_prefix_is_not_a_hit() -> None:
    manager = BlockManager(num_blocks=16, block_size=2, hash_fn=blind_to_the_prefix)
    first = seq("f", [1, 1, 5, 5, 0])  # blocks [1 1][5 5]
    manager.allocate(first)
    computed(manager, first)
    second = seq("g", [2, 2, 5, 5, 0])  # [2 2] is new; its [5 5] collides with first's
    manager.allocate(second)
    computed(manager, second)
    third = seq("h", [2, 2, 5, 5, 9])
    manager.allocate(third)
    # [2 2] is second's block; the cached [5 5] was computed after [1 1]: its KV differs.
    assert third.block_table[0] == second.block_table[0]
    assert third.block_table[1] != first.block_table[1]
    assert third.num_computed == 2



def test_a_salted_prefix_is_found_only_under_the_same_salt() -> None:
    manager = BlockManager(num_blocks=16, block_size=4)
    a = seq("a", list(range(10)))
    a.cache_salt = "tenant-a"
    manager.allocate(a)
    computed(manager, a)
    other = seq("b", list(range(10)))
    other.cache_salt = "tenant-b"
    manager.allocate(other)
    unsalted = seq("c", list(range(10)))
    manager.allocate(unsalted)
    again = seq("a2", list(range(10)))
    again.cache_salt = "tenant-a"
    manager.allocate(again)
    assert (other.num_computed, unsalted.num_computed, again.num_computed) == (0, 0, 8)
