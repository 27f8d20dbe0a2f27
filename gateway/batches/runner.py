"""Running one batch: validate its file, send its lines through the pipeline on spare
dedicated capacity first, spill to shared targets by the deadline forecast, and write
the output and error files.

The runner holds the batch's lease while it runs (renewed every third of `lease_s`);
each line's result is stored the moment it is known, so a replica that takes over a
dead holder's batch runs only the lines with no stored result. A line that was in
flight when its holder died is run again (its result had not been stored); no stored
result is ever overwritten, so no line appears twice in the output.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.batches.files import FileStore
from gateway.batches.forecast import LocalRate, rate_window_s, should_spill
from gateway.batches.gate import SpareCapacity
from gateway.batches.line_pipeline import BatchPipeline, LineAnswer, LineCall
from gateway.batches.lines import InputLine, input_lines
from gateway.batches.metrics import BatchMetrics
from gateway.batches.model import Batch, LineResult, Placement, Report
from gateway.batches.state import BatchState
from gateway.core.context import Endpoint
from policies.batch_schema import Batches
from policies.load import ModelTarget, Policy

log = logging.getLogger("routegate.batches")

IDLE_WAIT_S = 0.05  # how often a batch waiting for spare capacity looks again
SAVE_EVERY_S = 0.5  # progress (request_counts, the report) written at most this often


class LeaseLost(Exception):
    """Another replica holds the batch now: stop without finishing it."""


@dataclass(frozen=True, slots=True)
class Lane:
    """Where a line may go: its route's dedicated targets (empty: no dedicated capacity
    to wait for) and its cheapest shared price, for the all-shared comparison."""

    dedicated: tuple[ModelTarget, ...]
    cheapest_shared: ModelTarget | None


class BatchRun:
    def __init__(self, batch: Batch, *, state: BatchState, files: FileStore,
                 pipeline: BatchPipeline, gate: SpareCapacity, endpoint: Callable[[], Endpoint],
                 holder: str, metrics: BatchMetrics,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.batch, self.state, self.files = batch, state, files
        self.pipeline, self.gate, self.endpoint = pipeline, gate, endpoint
        self.holder, self.metrics = holder, metrics
        self.stopping = stopping  # the process drains: send no more lines, hand it over
        self.results: dict[int, LineResult] = {}
        self._saved_at = 0.0

    @property
    def settings(self) -> Batches:
        return self.pipeline.live.current.file.batches

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            renewal = group.create_task(self._renew())
            try:
                await self._run()
            finally:
                renewal.cancel()

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 3)
            if not await self.state.acquire(self.batch.id, self.holder, self.settings.lease_s):
                raise LeaseLost(self.batch.id)

    async def _run(self) -> None:
        batch = self.batch
        file = await self.state.get_file(batch.input_file_id)
        if file is None:
            await self._fail("input_file_missing", "The input file was deleted.")
            return
        try:
            data = await self.files.content(file)
        except FileNotFoundError:
            await self._fail("input_file_missing", f"The bytes of file '{file.id}' are not in "
                             "the data directory (with several replicas: is the shared "
                             "volume mounted on each?).")
            return
        lines = input_lines(data, batch.endpoint)
        self.results = await self.state.results(batch.id)
        self._recount()
        batch.total = len(lines)
        if batch.status == "validating":
            batch.status = "in_progress"
            batch.times["in_progress_at"] = int(time.time())
            await self.state.save(batch)
        for line in lines:  # a malformed line is an error record, never a lost one
            if line.body is None and line.index not in self.results:
                await self._keep(LineResult(
                    index=line.index, custom_id=line.custom_id, status=None, body=None,
                    request_id=f"{batch.id}-{line.index}", error_code=line.code,
                    error_message=line.error))
        todo = deque(line for line in lines
                     if line.body is not None and line.index not in self.results)
        outcome = await self._send(todo)
        if outcome == "stopped":  # another replica (or this one, restarted) goes on
            await self._save_progress(force=True)
        else:
            await self._finish(lines, outcome)

    async def _send(self, todo: deque[InputLine]) -> str:
        """Lines out until none is left: 'done', 'cancelled', 'expired', or 'stopped'
        (the process drains). Lines in flight finish first, except when this task is
        cancelled (shutdown, lease lost): then they are cancelled too, their results
        never stored, and whoever takes the batch over runs them."""
        batch = self.batch
        started = time.monotonic()
        rate = LocalRate(rate_window_s(batch.window_s), started)
        deferred: list[tuple[float, InputLine]] = []  # refused for now: (not before, line)
        running: dict[asyncio.Task[LineAnswer], tuple[InputLine, LineCall]] = {}
        cancel_checked = 0.0
        outcome = "done"
        try:
            while todo or running or deferred:
                now = time.monotonic()
                if now - cancel_checked > SAVE_EVERY_S:
                    cancel_checked = now
                    if await self.state.cancel_requested(batch.id) is not None:
                        outcome = "cancelled"
                        break
                if time.time() >= batch.expires_at:
                    outcome = "expired"
                    break
                if self.stopping():
                    outcome = "stopped"
                    break
                for not_before, line in list(deferred):
                    if not_before <= now:
                        deferred.remove((not_before, line))
                        todo.appendleft(line)
                self._dispatch(todo, running, rate, now)
                if not running:
                    await asyncio.sleep(IDLE_WAIT_S)
                    continue
                done, _ = await asyncio.wait(running, timeout=IDLE_WAIT_S,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    line, _ = running.pop(task)
                    answer = task.result()
                    if answer.retry_after_s is not None and time.time() < batch.expires_at:
                        deferred.append((time.monotonic() + answer.retry_after_s, line))
                        continue
                    result = self._result(line, answer)
                    if result.placement == "dedicated":
                        rate.line_finished(time.monotonic())
                    await self._keep(result)
                await self._save_progress()
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        if running:  # cancelled, expired or stopping: what is in flight still finishes
            finished = await asyncio.gather(*running, return_exceptions=True)
            for (line, _), outcome_of in zip(running.values(), finished, strict=True):
                if isinstance(outcome_of, LineAnswer) and outcome_of.retry_after_s is None:
                    await self._keep(self._result(line, outcome_of))
        if outcome == "expired":
            for line in [*todo, *(line for _, line in deferred)]:
                if line.index not in self.results:
                    await self._keep(LineResult(
                        index=line.index, custom_id=line.custom_id, status=None, body=None,
                        request_id=f"{batch.id}-{line.index}", error_code="batch_expired",
                        error_message="This line was not run before the batch expired."))
        return outcome

    def _dispatch(self, todo: deque[InputLine],
                  running: dict[asyncio.Task[LineAnswer], tuple[InputLine, LineCall]],
                  rate: LocalRate, now: float) -> None:
        settings, policy = self.settings, self.pipeline.live.current
        window_end = now + (self.batch.expires_at - time.time())
        while todo and len(running) < settings.lines_in_flight:
            line = todo[0]
            lane = lane_of(policy, line)
            placement: Placement | None = None
            if lane.dedicated:
                local = [sent for _, sent in running.values() if sent.placement == "dedicated"]
                local_left = len(todo) + len(local)
                # sent but not yet holding a slot: the queue does not count them yet
                starting = sum(1 for sent in local if sent.ctx is None or not sent.ctx.candidates)
                if any(self.gate.why_not(target, settings, starting) is None
                       for target in lane.dedicated):
                    placement = "dedicated"
                elif should_spill(now, local_left, rate.per_s(now), window_end,
                                  settings.spill_margin_s):
                    placement = "shared"
                else:
                    return  # no spare capacity now, and time enough: wait for it
            todo.popleft()
            assert line.body is not None
            model = line.body.get("model")
            spill_to = tuple(settings.routes[model].spill_to) \
                if isinstance(model, str) and model in settings.routes else ()
            call = LineCall(self.batch.id, self.batch.key_hash, orjson.dumps(line.body),
                            placement, spill_to, idempotency_key=f"{self.batch.id}/{line.index}")
            task = asyncio.create_task(self.pipeline.run(self.endpoint(), self.batch.endpoint,
                                                         call))
            running[task] = (line, call)

    def _result(self, line: InputLine, answer: LineAnswer) -> LineResult:
        ctx = answer.ctx
        record = ctx.record if ctx is not None else None
        body: Any = _json_or_text(answer.body)
        result = LineResult(index=line.index, custom_id=line.custom_id, status=answer.status,
                            body=body, request_id=record.request_id if record is not None
                            else f"{self.batch.id}-{line.index}")
        if record is not None:
            target = ctx.attempt.target if ctx is not None and ctx.attempt is not None else None
            if target is not None and record.attempts:
                result.placement = "dedicated" if target.backend.deployment == "dedicated" \
                    else "shared"
            result.input_tokens = record.input_tokens or 0
            result.output_tokens = record.output_tokens or 0
            result.cost_micros = record.cost_micros or 0
            cheapest = lane_of(self.pipeline.live.current, line).cheapest_shared
            if cheapest is not None:
                result.all_shared_cost_micros = price_micros(
                    cheapest, result.input_tokens, result.output_tokens)
        if not result.ok:
            error = body.get("error") if isinstance(body, dict) else None
            if isinstance(error, dict):
                result.error_code = str(error.get("code") or error.get("type") or "error")
                result.error_message = str(error.get("message") or "")
        return result

    async def _keep(self, result: LineResult) -> None:
        if result.index in self.results:
            return
        self.results[result.index] = result
        await self.state.put_result(self.batch.id, result)
        self.metrics.line(result)
        self._count(result)

    async def _save_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at = now
        await self.state.save(self.batch)

    def _recount(self) -> None:
        """From every stored result (a batch taken over: its earlier holder's lines)."""
        self.batch.completed = self.batch.failed = 0
        self.batch.report = Report()
        for result in self.results.values():
            self._count(result)

    def _count(self, result: LineResult) -> None:
        batch, report = self.batch, self.batch.report
        if result.ok:
            batch.completed += 1
        else:
            batch.failed += 1
        if result.placement is not None:
            split = report.dedicated if result.placement == "dedicated" else report.shared
            split.lines += 1
            split.input_tokens += result.input_tokens
            split.output_tokens += result.output_tokens
            split.cost_micros += result.cost_micros
        report.cost_micros += result.cost_micros
        report.all_shared_cost_micros += result.all_shared_cost_micros

    async def _finish(self, lines: list[InputLine], outcome: str) -> None:
        batch = self.batch
        now = int(time.time())
        if outcome == "cancelled":
            batch.status = "cancelling"
        else:
            batch.status = "finalizing"
            batch.times["finalizing_at"] = now
        await self._save_progress(force=True)
        ok = [self.results[i].file_line() for i in sorted(self.results) if self.results[i].ok]
        bad = [self.results[i].file_line() for i in sorted(self.results)
               if not self.results[i].ok]
        if ok:
            batch.output_file_id = (await self._write(ok, "output")).id
        if bad:
            batch.error_file_id = (await self._write(bad, "error")).id
        status = {"done": "completed", "cancelled": "cancelled", "expired": "expired"}[outcome]
        batch.status = status  # type: ignore[assignment]
        batch.times[f"{status}_at"] = int(time.time())
        await self._save_progress(force=True)
        self.metrics.batch_finished(status)
        log.info("batch %s %s: %d completed, %d failed of %d", batch.id, status,
                 batch.completed, batch.failed, batch.total)

    async def _write(self, items: list[dict[str, Any]], kind: str) -> Any:
        data = b"".join(orjson.dumps(item) + b"\n" for item in items)
        return await self.files.keep(self.batch.tenant, f"{self.batch.id}_{kind}.jsonl",
                                     "batch_output", data, len(items),
                                     self.batch.output_expires_s)

    async def _fail(self, code: str, message: str) -> None:
        batch = self.batch
        batch.status = "failed"
        batch.errors = [{"code": code, "message": message, "param": None, "line": None}]
        batch.times["failed_at"] = int(time.time())
        await self.state.save(batch)


def lane_of(policy: Policy, line: InputLine) -> Lane:
    model = line.body.get("model") if line.body is not None else None
    route = policy.routes.get(model) if isinstance(model, str) else None
    keys: tuple[str, ...] | list[str] = ()
    if route is not None:
        keys = route.targets
    elif isinstance(model, str) and model in policy.targets:
        keys = (model,)
    targets = [policy.targets[key] for key in keys if key in policy.targets]
    dedicated = tuple(t for t in targets if t.backend.deployment == "dedicated")
    shared = [t for t in targets if t.backend.deployment == "shared"]
    cheapest = min(shared, key=lambda t: t.spec.input_usd_per_mtok + t.spec.output_usd_per_mtok,
                   default=None)
    return Lane(dedicated, cheapest)


def price_micros(target: ModelTarget, input_tokens: int, output_tokens: int) -> int:
    """What the tokens cost at `target`'s prices, in micro-dollars (USD per million
    tokens is micro-dollars per token)."""
    spec = target.spec
    return round(input_tokens * spec.input_usd_per_mtok + output_tokens * spec.output_usd_per_mtok)


def _json_or_text(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode(errors="replace")
