"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts, prefix caching.

A block holds `block_size` consecutive tokens of one sequence. Once full, a block
is named by a hash chained over every token before it, so two requests with the
same prefix share the same physical blocks. Freed blocks keep their contents and
hash in an LRU free list until they are handed out again (that is what makes a
later request's prefix a cache hit).

The hash only finds a candidate. A hit is taken only when the block holds exactly
these tokens and follows exactly the block the previous hit matched (its id and the
generation it had then), so by induction the whole prefix is equal: two prompts
whose hashes collide never share KV, whoever sends them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from local_backend.engine.prefix_events import PrefixEvents
from local_backend.engine.sequence import Sequence

ROOT = (-1, 0)  # the "previous block" of a sequence's first block

HashFn = Callable[[int | None, list[int]], int]


def chain_hash(parent: int | None, tokens: list[int]) -> int:
    # Python's tuple hash of ints: deterministic (no per-process salt) and fast. A
    # collision costs a cache miss, never wrong KV: hits are verified (see above).
    return hash((parent, *tokens))


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, *, prefix_caching: bool = True,
        hash_fn: HashFn = chain_hash, events: PrefixEvents | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.hash_fn = hash_fn
        self.events = events  # told what is cached and evicted, for clients' prefix tags
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # What a cached block holds, checked on every hit: its tokens, and the block
        # before it as (id, generation). A block's generation changes each time it is
        # handed out again, so a stale "previous block" never matches.
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.block_parent: list[tuple[int, int]] = [ROOT] * num_blocks
        self.generation = [0] * num_blocks
        self.cached: dict[int, int] = {}  # hash → block id
        # Blocks with no reference, oldest first: popped from the front when allocating.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        # Keep a few blocks back when admitting, so running sequences can still grow.
        self.watermark = max(1, num_blocks // 100)
        self.cache_hits = 0
        self.cache_queries = 0

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        old = self.block_hash[block]
        if old is not None:  # evicting a cached block: forget its contents
            if self.cached.get(old) == block:
                del self.cached[old]
                if self.events is not None:
                    self.events.evicted(old)
            self.block_hash[block] = None
            self.block_tokens[block] = None
        self.generation[block] += 1
        self.ref_counts[block] = 1
        return block

    def _identity(self, block: int | None) -> tuple[int, int]:
        return ROOT if block is None else (block, self.generation[block])

    def _prefix_hits(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached blocks covering the longest prefix of `seq`, and their hashes."""
        if not self.prefix_caching:
            return [], []
        tokens, size = seq.tokens, self.block_size
        # At least one token must be computed to produce logits, so never hit the last token.
        full = (len(tokens) - 1) // size
        hits: list[int] = []
        hashes: list[int] = []
        parent: int | None = seq.cache_root
        for i in range(full):
            chunk = tokens[i * size : (i + 1) * size]
            parent = self.hash_fn(parent, chunk)
            block = self.cached.get(parent)
            if (
                block is None
                or self.block_tokens[block] != tuple(chunk)
                or self.block_parent[block] != self._identity(hits[-1] if hits else None)
            ):
                break
            hits.append(block)
            hashes.append(parent)
        return hits, hashes

    def blocks_to_admit(self, seq: Sequence) -> int:
        """Free blocks a waiting sequence would take if admitted now: new ones, and its
        prefix-cache hits that sit in the free list."""
        hits, _ = self._prefix_hits(seq)
        return self._taken(seq, hits)

    def _taken(self, seq: Sequence, hits: list[int]) -> int:
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)  # hits sitting in the free list
        return self.blocks_for(seq.num_tokens) - len(hits) + revived

    def allocate(self, seq: Sequence) -> bool:
        """Give a waiting sequence blocks for all its current tokens; False if they don't fit."""
        hits, hashes = self._prefix_hits(seq)
        needed = self.blocks_for(seq.num_tokens) - len(hits)
        if self.num_free - self._taken(seq, hits) < self.watermark:
            return False
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free[block]
            self.ref_counts[block] += 1
        seq.block_table = hits + [self._take_free() for _ in range(needed)]
        seq.block_hashes = hashes
        seq.num_computed = len(hits) * self.block_size
        self.cache_queries += seq.num_tokens
        self.cache_hits += seq.num_computed
        return True

    def append(self, seq: Sequence, num_new: int) -> bool:
        """Make room for `num_new` more tokens of a running sequence; False if out of blocks."""
        needed = self.blocks_for(seq.num_computed + num_new) - len(seq.block_table)
        if needed <= 0:
            return True
        if needed > self.num_free:
            return False
        seq.block_table.extend(self._take_free() for _ in range(needed))
        return True

    def commit(self, seq: Sequence) -> None:
        """Publish blocks that became full (K/V written) so later requests can share them."""
        if not self.prefix_caching:
            return
        size = self.block_size
        full = seq.num_computed // size
        if full <= len(seq.block_hashes):
            return
        tokens = seq.tokens
        parent = seq.block_hashes[-1] if seq.block_hashes else seq.cache_root
        for i in range(len(seq.block_hashes), full):
            chunk = tokens[i * size : (i + 1) * size]
            parent = self.hash_fn(parent, chunk)
            seq.block_hashes.append(parent)
            block = seq.block_table[i]
            if parent not in self.cached and self.block_hash[block] is None:
                self.cached[parent] = block
                self.block_hash[block] = parent
                self.block_tokens[block] = tuple(chunk)
                self.block_parent[block] = self._identity(seq.block_table[i - 1] if i else None)
        if seq.prefix_tags and self.events is not None:
            self._publish_tags(seq, self.events)

    def _publish_tags(self, seq: Sequence, events: PrefixEvents) -> None:
        """Tell `events` of the client's prefix tags whose blocks are now all computed."""
        done, tags = len(seq.block_hashes), seq.prefix_tags
        while seq.tags_published < len(tags) and tags[seq.tags_published][1] <= done:
            tag, needed = tags[seq.tags_published]
            events.stored(tag, seq.block_hashes[:needed], self.cached.__contains__)
            seq.tags_published += 1

    def release(self, seq: Sequence) -> None:
        """Drop a sequence's references; its tail blocks become the first to be evicted."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None
                if self.block_hash[block] is None:  # nothing worth keeping: reuse first
                    self.free.move_to_end(block, last=False)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed = 0
