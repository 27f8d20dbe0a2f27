"""Limit store in Redis: one global limit for any number of gateway replicas.

Each admission is one EVALSHA of `admit.lua` (redis-py's `Script` reloads it on
NOSCRIPT, e.g. after a Redis restart), each settlement one EVALSHA of
`settle.lua`, and the rare release of a request that never ran one of
`release.lua`. Every key of one tenant carries the hash tag `{tenant}`, so the
multi-key scripts also run on Redis Cluster (all keys land in one slot).
Window keys expire a minute after their last write and ledger keys after their
period, so idle tenants cost nothing. A settlement runs once per reservation id:
one replayed after a lost reply is recognised (settled ids are kept 2 minutes).

Time is the caller's `now`, sent as an argument: replicas need synchronised
clocks (NTP), and a few milliseconds of skew only shift a 60 s window by as
much. Every call is bounded by `op_timeout_s`; any Redis failure surfaces as
`StoreUnavailable`, which the fail-open wrapper (`failover.py`) turns into a
local decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from functools import partial
from importlib.resources import files
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.limits.ledger import PeriodCache, Periods
from gateway.limits.redis_topology import (
    CLUSTER_CONNECTIONS_PER_NODE,
    CLUSTER_SCHEME,
    SENTINEL_SCHEME,
    connect_cluster,
    connect_sentinel,
)
from gateway.limits.store import (
    WINDOW_S,
    BudgetLimits,
    Charge,
    Decision,
    LimitKind,
    PeriodUsage,
    Rejection,
    Reservation,
    Scope,
    ScopeState,
    StoreName,
    StoreUnavailable,
    TenantUsage,
)

log = logging.getLogger("routegate.limits")

WINDOW_MS = int(WINDOW_S * 1000)
SCOPE_TTL_MS = 2 * WINDOW_MS  # a window key outlives its newest entry by a minute
DAY_TTL_MS = 2 * 86_400_000  # the day's counters outlive the day, for late reads
MONTH_TTL_MS = 62 * 86_400_000
# How long a settled id is remembered, so that a replay of its settlement is a no-op. A
# replay follows a lost reply once the failover probe sees Redis answer: seconds when
# Redis was only slow, a restart's time when it went down right after. Each id costs
# Redis ~115 bytes for this long (a 60 s window costs ~215 bytes a request per scope).
SETTLED_TTL_MS = 2 * 60_000


def _script(name: str) -> str:
    return files("gateway.limits").joinpath(name).read_text(encoding="utf-8")


RedisClient = aioredis.Redis | RedisCluster


def connect(url: str, *, socket_timeout_s: float = 0.5, max_connections: int = 16,
            pool_wait_s: float = 1.0) -> RedisClient:
    """A client that fails fast: short socket timeouts, no retries, a bounded pool.

    A few connections suffice (a round trip takes ~0.2 ms on a LAN) and opening fewer
    at once matters: under a burst on a busy event loop, dozens of simultaneous
    connects is what times out first. The timeouts allow for that loop being busy:
    a stalled loop must not pass for a dead Redis.
    """
    if url.startswith(f"{CLUSTER_SCHEME}://"):
        return connect_cluster(url, socket_timeout_s=socket_timeout_s)
    if url.startswith(f"{SENTINEL_SCHEME}://"):
        return connect_sentinel(url, socket_timeout_s=socket_timeout_s,
                                max_connections=max_connections)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_wait_s,
        socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    return aioredis.Redis(connection_pool=pool)


def _scope_keys(tenant: str, scopes: Sequence[Scope]) -> list[str]:
    keys = []
    for scope in scopes:
        keys.append(f"rg:{{{tenant}}}:w:{scope.key}:log")
        keys.append(f"rg:{{{tenant}}}:w:{scope.key}:tok")
    return keys


def _ledger_keys(tenant: str, periods: Periods) -> list[str]:
    return [f"rg:{{{tenant}}}:spend:d:{periods.day}", f"rg:{{{tenant}}}:spend:m:{periods.month}"]


def _settled_key(tenant: str) -> str:
    return f"rg:{{{tenant}}}:settled"


def _limit(value: int | None) -> int:
    return -1 if value is None else value


def _seconds(ms: int) -> float | None:
    return None if ms < 0 else ms / 1000.0


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
        self._admit = client.register_script(_script("admit.lua"))
        self._settle = client.register_script(_script("settle.lua"))
        self._release = client.register_script(_script("release.lua"))
        self._periods = PeriodCache()
        self._releases: set[asyncio.Task[None]] = set()  # held so they are not collected

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

    async def _timed(self, coro: Any) -> Any:
        try:
            async with asyncio.timeout(self._op_timeout_s):
                return await coro
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

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
        now_ms = int(now * 1000)
        args: list[int | str] = [now_ms, WINDOW_MS, request_id, tokens,
                                 _limit(budget.day_micros), _limit(budget.month_micros)]
        for scope in scopes:
            args += [_limit(scope.requests_per_minute), _limit(scope.tokens_per_minute)]
        args.append(SCOPE_TTL_MS)
        keys = _scope_keys(tenant, scopes) + _ledger_keys(tenant, self._periods.at(now))
        # Cancelled meanwhile (the client left), the caller cannot know whether Redis
        # admitted it: the call runs on in a task of its own, and what it admitted is
        # released (cutting it short would only leave that unknown, and drop the
        # connection mid-reply).
        call = asyncio.ensure_future(self._call(self._admit(keys=keys, args=args)))
        try:
            reply = await asyncio.shield(call)
        except asyncio.CancelledError:
            abandoned = Reservation(request_id, tenant, tuple(scopes), tokens, now, self.name)
            call.add_done_callback(partial(self._release_abandoned, abandoned))
            raise
        verdict = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        which, limit, used, requested, retry_ms, spent_day, spent_month = (
            int(value) for value in reply[1:8])
        states = tuple(
            ScopeState(scope, int(reply[8 + 3 * i]), int(reply[9 + 3 * i]),
                       _seconds(int(reply[10 + 3 * i])))
            for i, scope in enumerate(scopes)
        ) if len(reply) > 8 else ()
        if verdict == "ok":
            reservation = Reservation(request_id, tenant, tuple(scopes), tokens, now, self.name)
            return Decision(reservation, None, states, spent_day, spent_month)
        kind: LimitKind = verdict  # type: ignore[assignment]  # the script's verdicts
        rejected_scope = scopes[which - 1] if which > 0 else None
        rejection = Rejection(kind, rejected_scope, limit, used, requested, _seconds(retry_ms))
        return Decision(None, rejection, states, spent_day, spent_month)

    def _release_abandoned(self, reservation: Reservation, call: asyncio.Future[Any]) -> None:
        """An admission whose caller was cancelled meanwhile has ended: give back what
        it admitted."""
        if call.cancelled() or call.exception() is not None:
            return
        if call.result()[0] not in (b"ok", "ok"):
            return
        release = asyncio.ensure_future(self._release_quietly(reservation))
        self._releases.add(release)
        release.add_done_callback(self._releases.discard)

    async def _release_quietly(self, reservation: Reservation) -> None:
        try:
            await self.release(reservation, reservation.admitted_at)
        except StoreUnavailable as exc:  # its window entry ages out within a minute
            log.warning("could not release an abandoned admission: %s", exc)

    async def settle(self, reservation: Reservation, actual_tokens: int, charge: Charge,
                     now: float) -> None:
        keys = (_scope_keys(reservation.tenant, reservation.scopes)
                + _ledger_keys(reservation.tenant, self._periods.at(now))
                + [_settled_key(reservation.tenant)])
        args: list[int | str] = [
            int(now * 1000), WINDOW_MS, reservation.id, actual_tokens - reservation.tokens,
            charge.input_tokens, charge.output_tokens, charge.cost_micros,
            SCOPE_TTL_MS, DAY_TTL_MS, MONTH_TTL_MS, SETTLED_TTL_MS]
        await self._call(self._settle(keys=keys, args=args))

    async def release(self, reservation: Reservation, now: float) -> None:
        """An admitted request that will never run: its tokens leave the windows, it
        stays counted as a request, and the ledger is untouched. Repeating it (or
        releasing what Redis never admitted) changes nothing."""
        keys = _scope_keys(reservation.tenant, reservation.scopes)
        await self._call(self._release(keys=keys, args=[reservation.id]))

    async def usage(self, tenant: str, now: float) -> TenantUsage:
        periods = self._periods.at(now)
        day_key, month_key = _ledger_keys(tenant, periods)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(day_key)
        pipe.hgetall(month_key)
        day, month = await self._call(pipe.execute())
        return TenantUsage(tenant, _period(periods.day, day), _period(periods.month, month))

    async def aclose(self) -> None:
        if isinstance(self.client, RedisCluster):
            await self.client.aclose()
        else:
            await self.client.aclose(close_connection_pool=True)


def _period(name: str, raw: dict[bytes, bytes]) -> PeriodUsage:
    def get(field: str) -> int:
        return int(raw.get(field.encode(), b"0"))

    return PeriodUsage(name, get("requests"), get("input_tokens"), get("output_tokens"),
                       get("spend_micros"))
