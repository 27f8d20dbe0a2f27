"""The sliding-window log the Redis limit store used before its window counter, kept
here only as the reference `bench/limits.py` measures against (it is no part of the
product): one zset entry and one hash field per admitted request and scope, kept for
a minute, and each settled id per tenant, kept two minutes.

`sliding_window_log_admit.lua` and `sliding_window_log_settle.lua` are that store's
scripts unchanged; `SlidingWindowLog` calls them with that store's keys and arguments,
on that store's call path (a task of its own, shielded, under the call's timeout; the
reply read into the decision, reservation and scope states it built), with a client
from the store's `connect`, so that the two stores' admissions cost what they cost in
the gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.limits.store import BudgetLimits, Charge, Decision, Reservation, Scope

HERE = Path(__file__).resolve().parent
WINDOW_MS = 60_000
SCOPE_TTL_MS = 2 * WINDOW_MS
DAY_TTL_MS = 2 * 86_400_000
MONTH_TTL_MS = 62 * 86_400_000
SETTLED_TTL_MS = 2 * 60_000
OP_TIMEOUT_S = 1.0
DAY, MONTH = "2025-11-29", "2025-11"  # the ledger period of the benchmark's clock


def _limit(value: int | None) -> int:
    return -1 if value is None else value


@dataclass(slots=True)
class LogScopeState:
    """That store's scope state: entries and tokens in the window, the oldest entry."""

    scope: Scope
    requests: int
    tokens: int
    oldest_at: float | None


class SlidingWindowLog:
    def __init__(self, client: Any) -> None:
        self.client = client
        self._admit = client.register_script(
            (HERE / "sliding_window_log_admit.lua").read_text(encoding="utf-8"))
        self._settle = client.register_script(
            (HERE / "sliding_window_log_settle.lua").read_text(encoding="utf-8"))

    @staticmethod
    def _keys(tenant: str, scopes: Sequence[Scope]) -> list[str]:
        keys = []
        for scope in scopes:
            keys += [f"rg:{{{tenant}}}:w:{scope.key}:log", f"rg:{{{tenant}}}:w:{scope.key}:tok"]
        return [*keys, f"rg:{{{tenant}}}:spend:d:{DAY}", f"rg:{{{tenant}}}:spend:m:{MONTH}"]

    async def admit(self, tenant: str, scopes: Sequence[Scope], tokens: int,
                    budget: BudgetLimits, now: float, request_id: str
                    ) -> tuple[Decision, tuple[LogScopeState, ...]]:
        """The decision and that store's scope states (its `Decision` held them), for
        admissions within the limits (the benchmark's): a refusal is not read."""
        args: list[int | str] = [int(now * 1000), WINDOW_MS, request_id, tokens,
                                 _limit(budget.day_micros), _limit(budget.month_micros)]
        for scope in scopes:
            args += [_limit(scope.requests_per_minute), _limit(scope.tokens_per_minute)]
        args.append(SCOPE_TTL_MS)
        call = asyncio.ensure_future(self._timed(self._admit(keys=self._keys(tenant, scopes),
                                                             args=args)))
        reply = await asyncio.shield(call)
        verdict = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        spent_day, spent_month = (int(value) for value in reply[6:8])
        states = tuple(
            LogScopeState(scope, int(reply[8 + 3 * i]), int(reply[9 + 3 * i]),
                          None if int(reply[10 + 3 * i]) < 0 else int(reply[10 + 3 * i]) / 1000)
            for i, scope in enumerate(scopes))
        reservation = (Reservation(request_id, tenant, tuple(scopes), tokens, now, "redis")
                       if verdict == "ok" else None)
        return Decision(reservation, None, (), spent_day, spent_month), states

    async def settle(self, tenant: str, scopes: Sequence[Scope], request_id: str,
                     delta_tokens: int, charge: Charge, now: float) -> None:
        keys = [*self._keys(tenant, scopes), f"rg:{{{tenant}}}:settled"]
        args: list[int | str] = [
            int(now * 1000), WINDOW_MS, request_id, delta_tokens, charge.input_tokens,
            charge.output_tokens, charge.cost_micros, SCOPE_TTL_MS, DAY_TTL_MS,
            MONTH_TTL_MS, SETTLED_TTL_MS]
        await self._timed(self._settle(keys=keys, args=args))

    @staticmethod
    async def _timed(call: Any) -> Any:
        async with asyncio.timeout(OP_TIMEOUT_S):
            return await call
