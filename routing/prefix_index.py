"""Which replica of a dedicated backend likely holds a prompt's prefix in its KV cache.

A prompt (its messages, in order) is cut into blocks of `block_chars` characters and
each full block is named by a hash chained over every block before it, so one hash
names a whole prefix, as an engine's own block hashes do (the gateway does not know a
replica's tokenizer, so characters stand in for tokens). A tenant's cache salt seeds
the chain: the same text under two salts shares no hash, as it shares no KV blocks in
an engine that takes `cache_salt`.

`PrefixIndex` remembers, for at most `max_blocks` hashes (least recently used dropped
first), the replicas that were sent a prompt holding that block. It is an estimate of
what each replica's cache holds: a replica may have evicted a block since. Pure and
single-threaded: the gateway owns one per backend and calls it from the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from hashlib import blake2b
from typing import Any

ROLE_MARK = "\x1e"  # between a message's role and its text: "user" + "hi" ≠ "useh" + "i"
MESSAGE_MARK = "\x1f"  # after each message


def prompt_text(messages: Sequence[Any]) -> str:
    """The messages in order as one string: role, text parts, in the order written.
    Non-text parts (images) are left out: they only shorten the prefix compared."""
    out: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        out.append(str(message.get("role", "")))
        out.append(ROLE_MARK)
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(part["text"] for part in content
                       if isinstance(part, Mapping) and isinstance(part.get("text"), str))
        out.append(MESSAGE_MARK)
    return "".join(out)


def block_hashes(text: str, block_chars: int, salt: str | None = None) -> list[int]:
    """The chained hash of each full `block_chars` block of `text` (a partial last block
    is not cached by an engine either); `salt` seeds the chain."""
    parent = b"" if salt is None else blake2b(salt.encode(), digest_size=8).digest()
    out = []
    for start in range(0, len(text) - block_chars + 1, block_chars):
        parent = blake2b(parent + text[start:start + block_chars].encode(),
                         digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


class PrefixIndex:
    """block hash → the replicas that were sent it, bounded at `max_blocks` hashes."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._holders: OrderedDict[int, set[str]] = OrderedDict()
        self.held: dict[str, int] = {}  # replica → blocks the index says it holds

    def __len__(self) -> int:
        return len(self._holders)

    def matched(self, hashes: Sequence[int]) -> dict[str, int]:
        """For each replica that holds some of them, how many of `hashes` from the
        first it holds: the deepest block it holds (a chained hash implies the rest)."""
        out: dict[str, int] = {}
        for depth, block in enumerate(hashes, 1):
            holders = self._holders.get(block)
            if holders is None:
                # no replica holds this prefix, so none holds a longer one
                break
            for replica in holders:
                out[replica] = depth
        return out

    def record(self, hashes: Iterable[int], replica: str) -> None:
        """`replica` was sent a prompt with these blocks: it holds them now."""
        holders_of, held = self._holders, self.held
        for block in hashes:
            holders = holders_of.get(block)
            if holders is None:
                holders_of[block] = {replica}
                held[replica] = held.get(replica, 0) + 1
            else:
                if replica not in holders:
                    holders.add(replica)
                    held[replica] = held.get(replica, 0) + 1
                holders_of.move_to_end(block)
        while len(holders_of) > self.max_blocks:
            _, dropped = holders_of.popitem(last=False)
            for gone in dropped:
                held[gone] -= 1

    def evicted(self, hashes: Iterable[int], replica: str) -> None:
        """`replica` says it no longer holds these blocks (a precise engine's report)."""
        for block in hashes:
            holders = self._holders.get(block)
            if holders is not None and replica in holders:
                holders.discard(replica)
                self.held[replica] -= 1
                if not holders:
                    del self._holders[block]

    def forget(self, replica: str) -> None:
        """`replica` left the fleet (or restarted with an empty cache)."""
        for block in [block for block, holders in self._holders.items() if replica in holders]:
            holders = self._holders[block]
            holders.discard(replica)
            if not holders:
                del self._holders[block]
        self.held.pop(replica, None)
