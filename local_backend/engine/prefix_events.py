"""What this engine's prefix cache holds, named by a client's own block hashes.

A router that picks replicas by prefix (the gateway's `pick: prefix`) names a prompt by
hashes of fixed blocks of its characters; this engine names its KV blocks by hashes of
token blocks. A request may carry its client's names (`prefix_tags`: each with the
number of token blocks of the prompt it covers); once those blocks are in the cache the
tag is *stored*, and the moment any one of them is evicted it is *evicted*. The client
follows the numbered event log (`since`) and so knows exactly which of its prefixes
this engine can still serve from cache, instead of guessing from what it sent.

Tags are bounded (`max_tags`; the least recently stored is dropped, as an eviction, so a
client never believes in a tag the engine no longer vouches for) and so is the log
(`max_events`): a client that falls behind it, or that knew an earlier life of this
engine (`epoch`), gets a reset with every tag held now.

Written by the engine thread (`BlockManager` calls `stored`/`evicted`), read from the
event loop (`since`): one lock.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_EVENTS_PER_READ = 10_000


@dataclass(frozen=True, slots=True)
class EventPage:
    epoch: str
    next: int  # ask for events after this one next time
    events: list[tuple[bool, int]]  # (held now?, tag), in order
    reset: bool = False  # forget what you knew of this engine; `held` is all there is
    held: list[int] | None = None


class PrefixEvents:
    def __init__(self, max_tags: int = 65_536, max_events: int = 65_536) -> None:
        self.max_tags, self.max_events = max_tags, max_events
        self.epoch = uuid.uuid4().hex  # this life of the engine: a restart starts empty
        self._lock = threading.Lock()
        self._log: deque[tuple[bool, int]] = deque()
        self._first = 1  # the number of _log[0]
        self._needs: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # tag → block hashes
        self._dependents: dict[int, set[int]] = {}  # block hash → tags that need it

    def stored(self, tag: int, blocks: Sequence[int], cached: Callable[[int], bool]) -> None:
        """The prompt named `tag` has its first `len(blocks)` token blocks (these hashes)
        computed; `cached` says whether a block hash is findable in the cache now."""
        with self._lock:
            if not blocks or not all(map(cached, blocks)):
                # the client assumed it would be held (it sent it here): correct that
                self._drop(tag)
                self._append(False, tag)
                return
            if tag in self._needs:
                self._needs.move_to_end(tag)
                if self._needs[tag] == tuple(blocks):
                    return
                self._unlink(tag)
            self._needs[tag] = tuple(blocks)
            for block in blocks:
                self._dependents.setdefault(block, set()).add(tag)
            self._append(True, tag)
            while len(self._needs) > self.max_tags:
                oldest = next(iter(self._needs))
                self._drop(oldest)
                self._append(False, oldest)

    def not_held(self, tag: int) -> None:
        """The prompt named `tag` left its last block partly filled: never cached."""
        with self._lock:
            self._drop(tag)
            self._append(False, tag)

    def evicted(self, block: int) -> None:
        """The block with this hash left the cache: every tag that needs it is gone."""
        with self._lock:
            for tag in self._dependents.pop(block, ()):
                self._drop(tag)
                self._append(False, tag)

    def since(self, after: int, epoch: str | None) -> EventPage:
        """Events numbered above `after` (at most MAX_EVENTS_PER_READ), or a reset when
        the client knew another life of this engine or fell behind the log."""
        with self._lock:
            end = self._first + len(self._log) - 1
            if epoch != self.epoch or after < self._first - 1 or after > end:
                return EventPage(self.epoch, end, [], reset=True, held=list(self._needs))
            start = after - self._first + 1
            events = [self._log[i] for i in range(start, min(len(self._log),
                                                              start + MAX_EVENTS_PER_READ))]
            return EventPage(self.epoch, after + len(events), events)

    # ---- under the lock ---------------------------------------------------------------
    def _append(self, held: bool, tag: int) -> None:
        self._log.append((held, tag))
        if len(self._log) > self.max_events:
            self._log.popleft()
            self._first += 1

    def _drop(self, tag: int) -> None:
        if tag in self._needs:
            self._unlink(tag)
            del self._needs[tag]

    def _unlink(self, tag: int) -> None:
        for block in self._needs[tag]:
            dependents = self._dependents.get(block)
            if dependents is not None:
                dependents.discard(tag)
                if not dependents:
                    del self._dependents[block]
