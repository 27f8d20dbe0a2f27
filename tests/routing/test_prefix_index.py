"""The prompt's chained block hashes and the bounded index of who holds them."""

from __future__ import annotations

import random

from routing.prefix_index import PrefixIndex, block_hashes, prompt_text

SYSTEM = {"role": "system", "content": "You answer questions about invoices. " * 20}


def hashes(*messages: dict[str, str], salt: str | None = None) -> list[int]:
    return block_hashes(prompt_text(messages), 64, salt)


def test_prompts_sharing_a_prefix_share_its_block_hashes_and_no_more() -> None:
    first = hashes(SYSTEM, {"role": "user", "content": "what is due?"})
    second = hashes(SYSTEM, {"role": "user", "content": "who pays?"})
    shared = len(prompt_text([SYSTEM])) // 64
    assert first[:shared] == second[:shared]
    assert len(first) >= shared


def test_a_block_hash_names_everything_before_it() -> None:
    one = hashes({"role": "system", "content": "a" * 64 + "b" * 64})
    other = hashes({"role": "system", "content": "c" * 64 + "b" * 64})
    assert one[1] != other[1]  # the same second block after a different first


def test_a_salt_changes_every_hash() -> None:
    assert not set(hashes(SYSTEM, salt="tenant-a")) & set(hashes(SYSTEM, salt="tenant-b"))


def test_roles_and_message_bounds_are_part_of_the_text() -> None:
    assert prompt_text([{"role": "user", "content": "hi"}]) != \
        prompt_text([{"role": "use", "content": "rhi"}])


def test_the_index_knows_how_deep_each_replica_holds_a_prompt() -> None:
    index = PrefixIndex(max_blocks=1000)
    long = hashes(SYSTEM, {"role": "user", "content": "x" * 300})
    index.record(long[:3], "r1")
    index.record(long, "r2")
    assert index.matched(long) == {"r1": 3, "r2": len(long)}
    index.forget("r2")
    assert index.matched(long) == {"r1": 3}


def test_the_index_stays_within_its_bound_under_a_stream_of_random_prompts() -> None:
    index = PrefixIndex(max_blocks=500)
    draw = random.Random(7)
    for _ in range(2000):
        text = "".join(draw.choice("abcdef") for _ in range(draw.randint(64, 640)))
        index.record(block_hashes(text, 64), f"r{draw.randint(0, 3)}")
        assert len(index) <= 500
    recent = block_hashes("z" * 640, 64)
    index.record(recent, "r0")
    assert index.matched(recent) == {"r0": len(recent)}  # the newest are kept


def test_the_index_counts_the_blocks_each_replica_holds_within_its_bound() -> None:
    index = PrefixIndex(max_blocks=4)
    index.record([1, 2, 3], "r1")
    index.record([1, 2], "r2")
    assert index.held == {"r1": 3, "r2": 2}
    index.record([7, 8], "r2")  # drops block 3, the least recently sent
    assert index.held == {"r1": 2, "r2": 4}
    index.forget("r2")
    assert index.held == {"r1": 2}
