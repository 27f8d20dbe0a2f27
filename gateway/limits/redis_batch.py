"""Script calls made in one event-loop turn go to Redis together, in one pipeline.

Under load many requests reach admission (or settlement) in the same turn of the event
loop; sent one by one, each pays redis-py's whole per-command path (a connection taken
from the pool and given back, a write, a read, a timeout scope). Collected here, they
leave as one non-transactional pipeline on one connection: one write, the replies read
in order. The first call of a turn schedules the send with `call_soon`, so a call alone
in its turn goes at once, and nothing waits for a timer.

Each call keeps its own outcome: a script's error reaches only its caller, and NOSCRIPT
(a Redis restarted or flushed since the scripts were loaded) loads the script and sends
those calls again. A failure of the pipeline itself (connection, timeout) reaches every
call in it. A caller that stops waiting (cancelled, or past its own timeout) does not
stop the batch: the others still get their replies, and its own reply is still
delivered to whoever else holds its future (an admission's release of what was admitted).

The cluster client keeps one call per command: a batch there would span nodes, which
its pipeline splits per node anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

Call = tuple[AsyncScript, Sequence[str], Sequence[int | str], "asyncio.Future[Any]"]


class ScriptBatch:
    """Batches `AsyncScript` calls to one standalone (or Sentinel-managed) Redis."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._pending: list[Call] = []
        self._sending: set[asyncio.Task[None]] = set()  # held so they are not collected
        self.batches = 0  # batches sent (a NOSCRIPT's resend not counted again)
        self.calls = 0  # script calls in them

    def call(self, script: AsyncScript, keys: Sequence[str],
             args: Sequence[int | str]) -> asyncio.Future[Any]:
        """The script's reply, once this turn's batch has been answered."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((script, keys, args, future))
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[Call]) -> None:
        self.batches += 1
        self.calls += len(batch)
        try:
            replies = await self._pipeline(batch)
            missing = [i for i, reply in enumerate(replies)
                       if isinstance(reply, NoScriptError)]
            if missing:  # loaded once per script, then those calls once more
                for script in {id(batch[i][0]): batch[i][0] for i in missing}.values():
                    script.sha = await self._client.script_load(script.script)
                again = await self._pipeline([batch[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        except BaseException as exc:  # the pipeline failed: every caller learns why
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (*_, future), reply in zip(batch, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _pipeline(self, batch: list[Call]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for script, keys, args, _ in batch:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def aclose(self) -> None:
        """Batches under way finish first (each bounded by the client's socket timeout)."""
        await asyncio.gather(*self._sending, return_exceptions=True)
