"""Spend ledger arithmetic: budget periods, prices and micro-dollar costs.

Money is integer micro-dollars everywhere in accounting (1 USD = 1_000_000).
A price in USD per million tokens is, conveniently, exactly micro-dollars per
token, so `cost = tokens × usd_per_mtok` needs no scaling; it is rounded once,
per request, to a whole micro-dollar.

Budget periods are calendar periods in UTC: a day resets at 00:00 UTC, a month
on the 1st at 00:00 UTC. The stores keep one counter set per tenant per period.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from policies.schema import Budget

MICROS_PER_USD = 1_000_000


@dataclass(frozen=True, slots=True)
class Periods:
    day: str  # "2026-11-29"
    month: str  # "2026-11"
    day_starts_at: float  # epoch seconds of this day's 00:00 UTC
    day_resets_at: float  # epoch seconds of the next 00:00 UTC
    month_resets_at: float  # epoch seconds of the next 1st, 00:00 UTC


def periods_at(now: float) -> Periods:
    moment = datetime.fromtimestamp(now, tz=UTC)
    day_start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if moment.month == 12:
        next_month = day_start.replace(year=moment.year + 1, month=1, day=1)
    else:
        next_month = day_start.replace(month=moment.month + 1, day=1)
    return Periods(
        day=moment.strftime("%Y-%m-%d"),
        month=moment.strftime("%Y-%m"),
        day_starts_at=day_start.timestamp(),
        day_resets_at=(day_start + timedelta(days=1)).timestamp(),
        month_resets_at=next_month.timestamp(),
    )


class PeriodCache:
    """`periods_at` for the hot path: recomputed only when `now` leaves the cached day
    (calendar arithmetic costs ~7 µs, more than the rest of an admission)."""

    __slots__ = ("_current",)

    def __init__(self) -> None:
        self._current = periods_at(0.0)

    def at(self, now: float) -> Periods:
        current = self._current
        if not current.day_starts_at <= now < current.day_resets_at:
            current = self._current = periods_at(now)
        return current


def usd_to_micros(usd: float | None) -> int | None:
    return None if usd is None else round(usd * MICROS_PER_USD)


def budget_micros(budget: Budget) -> tuple[int | None, int | None]:
    """(per day, per month) ceilings of a policy `Budget`, in micro-dollars."""
    return usd_to_micros(budget.usd_per_day), usd_to_micros(budget.usd_per_month)


def remaining_budget_micros(day_limit: int | None, month_limit: int | None,
                            spent_day: int, spent_month: int) -> int | None:
    """What the tenant may still spend before a budget stops it (None: unlimited)."""
    remaining = [limit - spent for limit, spent in
                 ((day_limit, spent_day), (month_limit, spent_month)) if limit is not None]
    return max(0, min(remaining)) if remaining else None
