"""Limit store in Redis: one global limit for any number of gateway replicas.

Each admission is one EVALSHA of `admit.lua` (redis-py's `Script` reloads it on
NOSCRIPT, e.g. after a Redis restart), each settlement one EVALSHA of
`settle.lua`, and the rare release of a request that never ran one of
`release.lua`; `window.lua`, the sliding-window counter they share, is prepended to
each. A scope is one small hash of five integers (`window_counter.py`), so a tenant's
limit state is the same size at any traffic. Every key of one tenant carries the hash
tag `{tenant}`, so the multi-key scripts also run on Redis Cluster (all keys land in
one slot). Window keys expire two windows after their last write (nothing of them
weighs by then) and ledger keys after their period, so idle tenants cost nothing.

Settlements and releases run once per reservation: each gateway process numbers its
admissions, and the tenant's receipts for that process (a string of `RECEIPT_SLOTS`
16-bit slots, the same size whatever the traffic) say which were admitted and which are
settled or released, so one replayed after a lost reply changes nothing. A replay is
recognised while its slot is not reused, i.e. until the process has reserved
`RECEIPT_SLOTS` more numbers — far more than can be in flight when a reply is lost — and
for `RECEIPTS_TTL_MS` after the receipts' last write.

Time is the caller's `now`, sent as an argument: replicas need synchronised
clocks (NTP), and a few milliseconds of skew only shift a 60 s window by as
much. Every call is bounded by `op_timeout_s`; any Redis failure surfaces as
`StoreUnavailable`, which the fail-open wrapper (`failover.py`) turns into a
local decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from importlib.resources import files
from random import getrandbits
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.limits.ledger import PeriodCache, Periods
from gateway.limits.redis_batch import ScriptBatch
from gateway.limits.store import (
    BudgetLimits,
    Charge,
    Decision,
    PeriodUsage,
    Rejection,
    Reservation,
    Scope,
    StoreName,
    StoreUnavailable,
    TenantUsage,
)
from gateway.limits.window_counter import (
    WINDOW_MS,
    Window,
    counted_in_ms,
    rejection_of,
    scope_state,
    to_ms,
)
from gateway.stores.redis import CLUSTER_CONNECTIONS_PER_NODE, RedisClient

log = logging.getLogger("routegate.limits")

# A window key outlives its last write by two windows: by then nothing it counted weighs.
SCOPE_TTL_MS = 2 * WINDOW_MS
DAY_TTL_MS = 2 * 86_400_000  # the day's counters outlive the day, for late reads
MONTH_TTL_MS = 62 * 86_400_000
# How long receipts outlive their last write, so that a replayed settlement is a no-op.
# A replay follows a lost reply once the failover probe sees Redis answer: seconds when
# Redis was only slow, a restart's time when it went down right after.
RECEIPTS_TTL_MS = 2 * 60_000
# Receipt slots per tenant and gateway process (2 bytes each): a replay is recognised
# until the process has numbered this many more admissions.
RECEIPT_SLOTS = 256


def _script(name: str) -> str:
    """A script with the window functions it shares with the others before it."""
    package = files("gateway.limits")
    return (package.joinpath("window.lua").read_text(encoding="utf-8")
            + package.joinpath(name).read_text(encoding="utf-8"))


def _scope_keys(tenant: str, scopes: Sequence[Scope]) -> list[str]:
    return [f"rg:{{{tenant}}}:w:{scope.key}" for scope in scopes]


def _ledger_keys(tenant: str, periods: Periods) -> list[str]:
    return [f"rg:{{{tenant}}}:spend:d:{periods.day}", f"rg:{{{tenant}}}:spend:m:{periods.month}"]


def _limit(value: int | None) -> int:
    return -1 if value is None else value


@dataclass(frozen=True, slots=True)
class Receipt:
    """A reservation's number among this process's (`Reservation.handle`)."""

    number: int


class AdmissionUnknown(StoreUnavailable):
    """The admission's call failed: Redis may have admitted it all the same (a reply
    lost to a timeout). `reservation` is what it would have admitted, for a release."""

    def __init__(self, message: str, reservation: Reservation, *, slow: bool = False) -> None:
        super().__init__(message, slow=slow)
        self.reservation = reservation


class RedisStore:
    name: StoreName = "redis"

    def __init__(self, client: RedisClient, *, op_timeout_s: float = 1.0) -> None:
        self.client = client
        self._op_timeout_s = op_timeout_s
        # The cluster client refuses a command when a node's connections are all busy,
        # where the standalone one waits for one: calls wait here instead (bounded).
        self._in_flight = (asyncio.Semaphore(CLUSTER_CONNECTIONS_PER_NODE)
                           if isinstance(client, RedisCluster) else None)
        self._loading = asyncio.Lock()
        self._scripts_loaded = False
        # calls of one event-loop turn in one pipeline (redis_batch.py); a cluster's
        # calls go one by one
        self.batch = ScriptBatch(client) if isinstance(client, aioredis.Redis) else None
        self._admit = client.register_script(_script("admit.lua"))
        self._settle = client.register_script(_script("settle.lua"))
        self._release = client.register_script(_script("release.lua"))
        self._periods = PeriodCache()
        self._releases: set[asyncio.Task[None]] = set()  # held so they are not collected
        # this process's receipts in each tenant's keys (random: replicas and workers
        # never share one), and the number of its next reservation
        self._process = f"{getrandbits(64):016x}"
        self._numbers = itertools.count(1)

    async def _call(self, coro: Any) -> Any:
        if self._in_flight is not None:  # a cluster: the wait for a turn is not Redis's
            async with self._in_flight:
                if not self._scripts_loaded:
                    await self._load_scripts()
                return await self._timed(coro)
        return await self._timed(coro)

    async def _load_scripts(self) -> None:
        """On a cluster, before the first call: many calls at once finding a script
        missing (NOSCRIPT), each loading it, broke the cluster client's connections."""
        async with self._loading:
            if not self._scripts_loaded:
                for script in (self._admit, self._settle, self._release):
                    await self._timed(self.client.script_load(script.script))
                self._scripts_loaded = True

    def _start(self, script: AsyncScript, keys: list[str],
               args: list[int | str]) -> asyncio.Future[Any]:
        """A script call under way, whatever becomes of its caller: the batch's future, or
        (a cluster) a task of its own."""
        if self.batch is not None:
            return self.batch.call(script, keys, args)
        return asyncio.ensure_future(self._call(script(keys=keys, args=args)))

    async def _timed(self, awaitable: Any) -> Any:
        """`awaitable` within `op_timeout_s`, Redis's failures as `StoreUnavailable` (a
        call under way is shielded: it runs on for the others in its batch)."""
        if isinstance(awaitable, asyncio.Future):
            awaitable = asyncio.shield(awaitable)
        try:
            async with asyncio.timeout(self._op_timeout_s):
                return await awaitable
        except (RedisTimeoutError, TimeoutError) as exc:  # the socket's, or ours
            raise StoreUnavailable(f"redis: no answer in time ({type(exc).__name__}: {exc})",
                                   slow=True) from exc
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        except (AttributeError, TypeError) as exc:
            # redis-py's own failure on a connection closed under a write (by the peer, or
            # by the cluster client dropping a node's connections after another call
            # failed): `'NoneType' object has no attribute 'writelines'` and kin, not a
            # RedisError (redis/redis-py#4287). `awaitable` is redis-py's alone.
            raise StoreUnavailable(f"redis: connection closed under a call ({exc})") from exc

    async def ping(self) -> None:
        await self._call(self.client.ping())

    async def drop_connections(self) -> None:
        """Close every pooled connection, in use or idle: after an outage they lead to
        a Redis that is gone (a restarted one knows none of them)."""
        if not isinstance(self.client, aioredis.Redis):  # a cluster client re-learns its nodes
            return
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(self._op_timeout_s):
                if isinstance(self.client, RedisCluster):  # a pool per node
                    await asyncio.gather(*(node.disconnect()
                                           for node in self.client.get_nodes()))
                else:
                    await self.client.connection_pool.disconnect(inuse_connections=True)

    async def admit(self, tenant: str, scopes: Sequence[Scope], tokens: int,
                    budget: BudgetLimits, now: float, request_id: str) -> Decision:
        now_ms = to_ms(now)
        receipt = Receipt(next(self._numbers))
        args: list[int | str] = [now_ms, WINDOW_MS, SCOPE_TTL_MS, RECEIPTS_TTL_MS,
                                 RECEIPT_SLOTS, receipt.number, tokens,
                                 _limit(budget.day_micros), _limit(budget.month_micros)]
        for scope in scopes:
            args += [_limit(scope.requests_per_minute), _limit(scope.tokens_per_minute)]
        keys = (_scope_keys(tenant, scopes) + _ledger_keys(tenant, self._periods.at(now))
                + [self._receipts_key(tenant)])
        # Cancelled meanwhile (the client left), the caller cannot know whether Redis
        # admitted it: the call runs on in a task of its own, and what it admitted is
        # released (cutting it short would only leave that unknown, and drop the
        # connection mid-reply).
        call = self._start(self._admit, keys, args)
        try:
            reply = await self._timed(call)
        except asyncio.CancelledError:
            pending = Reservation(request_id, tenant, tuple(scopes), tokens, now, self.name,
                                  handle=receipt)
            call.add_done_callback(partial(self._release_abandoned, pending))
            raise
        except StoreUnavailable as exc:
            pending = Reservation(request_id, tenant, tuple(scopes), tokens, now, self.name,
                                  handle=receipt)
            raise AdmissionUnknown(str(exc), pending, slow=exc.slow) from exc
        verdict = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        which, spent_day, spent_month = int(reply[1]), int(reply[2]), int(reply[3])
        if verdict in ("budget_day", "budget_month"):
            daily = verdict == "budget_day"
            rejection = Rejection("budget_day" if daily else "budget_month", None,
                                  _limit(budget.day_micros if daily else budget.month_micros),
                                  spent_day if daily else spent_month, 0, None)
            return Decision(None, rejection, (), spent_day, spent_month)
        windows = _windows(reply, len(scopes))
        elapsed = [window.roll(now_ms) for window in windows]  # as far as the script rolled
        states = tuple([scope_state(scope, window, at)
                        for scope, window, at in zip(scopes, windows, elapsed, strict=True)])
        if verdict == "ok":
            reservation = Reservation(request_id, tenant, tuple(scopes), tokens, now, self.name,
                                      tuple([w.start_ms for w in windows]), receipt)
            return Decision(reservation, None, states, spent_day, spent_month)
        # the script's verdicts: "ok", the two budgets, "requests" or "tokens"
        kind: Literal["requests", "tokens"] = verdict  # type: ignore[assignment]
        i = which - 1
        return Decision(None, rejection_of(kind, scopes[i], windows[i], elapsed[i], tokens),
                        states, spent_day, spent_month)

    def _receipts_key(self, tenant: str) -> str:
        return f"rg:{{{tenant}}}:receipts:{self._process}"

    def _release_abandoned(self, reservation: Reservation, call: asyncio.Future[Any]) -> None:
        """An admission whose caller was cancelled meanwhile has ended: give back what
        it admitted."""
        if call.cancelled() or call.exception() is not None:
            return
        reply = call.result()
        if reply[0] not in (b"ok", "ok"):
            return
        counted_in = tuple([w.start_ms for w in _windows(reply, len(reservation.scopes))])
        release = asyncio.ensure_future(self._release_quietly(
            replace(reservation, windows_ms=counted_in)))
        self._releases.add(release)
        release.add_done_callback(self._releases.discard)

    async def _release_quietly(self, reservation: Reservation) -> None:
        try:
            await self.release(reservation, reservation.admitted_at)
        except StoreUnavailable as exc:  # its tokens stop weighing within two windows
            log.warning("could not release an abandoned admission: %s", exc)

    def _receipt(self, reservation: Reservation) -> Receipt:
        """Its number (one this store never gave it gets a number now: the settlement
        counts, but a replay of it would count again)."""
        handle = reservation.handle
        return handle if isinstance(handle, Receipt) else Receipt(next(self._numbers))

    def spend_only(self, reservation: Reservation) -> Reservation:
        """A reservation another store admitted, as one whose settlement adds only to this
        ledger (no window here counted it), numbered so that a replay is recognised."""
        return replace(reservation, scopes=(), windows_ms=(), store=self.name,
                       handle=Receipt(next(self._numbers)))

    async def settle(self, reservation: Reservation, actual_tokens: int, charge: Charge,
                     now: float) -> None:
        tenant = reservation.tenant
        keys = (_scope_keys(tenant, reservation.scopes)
                + _ledger_keys(tenant, self._periods.at(now)) + [self._receipts_key(tenant)])
        args: list[int | str] = [
            to_ms(now), WINDOW_MS, SCOPE_TTL_MS, RECEIPTS_TTL_MS, RECEIPT_SLOTS,
            self._receipt(reservation).number, actual_tokens - reservation.tokens,
            charge.input_tokens, charge.output_tokens, charge.cost_micros,
            DAY_TTL_MS, MONTH_TTL_MS, int(charge.refund_request), *counted_in_ms(reservation)]
        await self._timed(self._start(self._settle, keys, args))

    async def release(self, reservation: Reservation, now: float) -> None:
        """An admitted request that will never run: its tokens leave the windows, it
        stays counted as a request, and the ledger is untouched. Repeating it (or
        releasing what Redis never admitted) changes nothing."""
        if not isinstance(reservation.handle, Receipt):
            return  # never numbered here, so never admitted here
        tenant = reservation.tenant
        keys = [*_scope_keys(tenant, reservation.scopes), self._receipts_key(tenant)]
        args: list[int | str] = [
            to_ms(now), WINDOW_MS, SCOPE_TTL_MS, RECEIPTS_TTL_MS, RECEIPT_SLOTS,
            reservation.handle.number, reservation.tokens, *counted_in_ms(reservation)]
        await self._timed(self._start(self._release, keys, args))

    async def usage(self, tenant: str, now: float) -> TenantUsage:
        periods = self._periods.at(now)
        day_key, month_key = _ledger_keys(tenant, periods)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(day_key)
        pipe.hgetall(month_key)
        day, month = await self._call(pipe.execute())
        return TenantUsage(tenant, _period(periods.day, day), _period(periods.month, month))

    async def aclose(self) -> None:
        if self.batch is not None:
            await self.batch.aclose()
        if isinstance(self.client, RedisCluster):
            await self.client.aclose()
        else:
            await self.client.aclose(close_connection_pool=True)


def _windows(reply: list[Any], scopes: int) -> list[Window]:
    """Each scope's window as `admit.lua` left it (five integers a scope, after four)."""
    return [Window(int(reply[i]), int(reply[i + 1]), int(reply[i + 2]), int(reply[i + 3]),
                   int(reply[i + 4])) for i in range(4, 4 + 5 * scopes, 5)]


def _period(name: str, raw: dict[bytes, bytes]) -> PeriodUsage:
    def get(field: str) -> int:
        return int(raw.get(field.encode(), b"0"))

    return PeriodUsage(name, get("requests"), get("input_tokens"), get("output_tokens"),
                       get("spend_micros"))
