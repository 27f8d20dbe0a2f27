"""The spend ledger by day × (tenant, key, model, route, backend), for `GET /admin/spend`.

Each settled request adds its cost — `record.cost_micros`, the integer micro-dollars the
limit store charged to budgets — to a pending row in memory; the rows go to the key
store once a second (one write for all of them), so reporting costs requests nothing.
A write that fails is kept and retried with the next; past `MAX_PENDING_ROWS` distinct
rows (the store out for long) new rows are dropped and counted. Budgets never read
this ledger, except a key's lifetime budget (`budget.usd_total`), which the limit store
has no period for: it reads the key's total here, at most once a second per key.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from gateway.keys.store import KeyStore, KeyStoreUnavailable, SpendRow
from gateway.limits.ledger import MICROS_PER_USD

log = logging.getLogger("routegate.keys")

MAX_PENDING_ROWS = 100_000
TOTALS_TTL_S = 1.0  # how old a key's lifetime spend may be when a budget reads it

Dims = tuple[str, str, str, str, str, str]  # day, tenant, key, model, route, backend


class SpendLedger:
    def __init__(self, store: KeyStore, *, flush_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self._clock = clock
        self._pending: dict[Dims, list[int]] = {}  # requests, input, output, cost
        self._pending_by_key: dict[str, int] = {}
        self._totals: dict[str, tuple[float, int]] = {}  # key id → (read at, micros)
        self.dropped = 0
        self._day_cache: tuple[int, str] = (-1, "")

    def day(self, now: float) -> str:
        bucket = int(now // 86_400)
        if bucket != self._day_cache[0]:
            self._day_cache = (bucket, datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d"))
        return self._day_cache[1]

    def add(self, tenant: str, key: str, model: str, route: str, backend: str,
            input_tokens: int, output_tokens: int, cost_micros: int) -> None:
        dims = (self.day(self._clock()), tenant, key, model, route, backend)
        row = self._pending.get(dims)
        if row is None:
            if len(self._pending) >= MAX_PENDING_ROWS:
                self.dropped += 1
                return
            row = self._pending[dims] = [0, 0, 0, 0]
        row[0] += 1
        row[1] += input_tokens
        row[2] += output_tokens
        row[3] += cost_micros
        if key and cost_micros:
            self._pending_by_key[key] = self._pending_by_key.get(key, 0) + cost_micros

    async def flush(self) -> None:
        pending, self._pending = self._pending, {}
        by_key, self._pending_by_key = self._pending_by_key, {}
        if not pending:
            return
        rows = [SpendRow(*dims, *values) for dims, values in pending.items()]
        try:
            await self.store.add_spend(rows)
        except KeyStoreUnavailable:
            for dims, values in pending.items():  # kept for the next flush
                row = self._pending.setdefault(dims, [0, 0, 0, 0])
                for i, value in enumerate(values):
                    row[i] += value
            for key, micros in by_key.items():
                self._pending_by_key[key] = self._pending_by_key.get(key, 0) + micros
            raise
        for key, micros in by_key.items():  # now in the store's total
            known = self._totals.get(key)
            if known is not None:
                self._totals[key] = (known[0], known[1] + micros)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                await self.flush()
            except KeyStoreUnavailable as exc:
                log.warning("spend not written yet (kept for the next try): %s", exc)
            except Exception:  # a task supervisor: the next flush still runs
                log.exception("spend not written")

    async def key_total_micros(self, key_id: str) -> int:
        """What a key has spent in all, as of at most `TOTALS_TTL_S` ago on any replica."""
        now = time.monotonic()
        known = self._totals.get(key_id)
        if known is None or now - known[0] > TOTALS_TTL_S:
            total = (await self.store.key_total_micros([key_id])).get(key_id, 0)
            known = self._totals[key_id] = (now, total)
        return known[1] + self._pending_by_key.get(key_id, 0)


def group(rows: Iterable[SpendRow], by: Sequence[str]) -> list[dict[str, object]]:
    """Rows summed per day and the `by` dimensions, in order."""
    sums: dict[tuple[str, ...], list[int]] = {}
    for row in rows:
        values = (row.day, *[getattr(row, name) for name in by])
        total = sums.setdefault(values, [0, 0, 0, 0])
        total[0] += row.requests
        total[1] += row.input_tokens
        total[2] += row.output_tokens
        total[3] += row.cost_micros
    out: list[dict[str, object]] = []
    for values in sorted(sums):
        requests, input_tokens, output_tokens, cost = sums[values]
        out.append({"day": values[0], **dict(zip(by, values[1:], strict=True)),
                    "requests": requests, "input_tokens": input_tokens,
                    "output_tokens": output_tokens, "cost_micros": cost,
                    "cost_usd": cost / MICROS_PER_USD})
    return out


def as_csv(rows: list[dict[str, object]], by: Sequence[str]) -> str:
    columns = ["day", *by, "requests", "input_tokens", "output_tokens", "cost_micros",
               "cost_usd"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "cost_usd": f"{int(row['cost_micros']) / MICROS_PER_USD:.6f}"})  # type: ignore[call-overload]
    return buffer.getvalue()


