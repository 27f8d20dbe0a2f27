"""A request's answer from the engine's outputs: one JSON body, or server-sent events
as tokens come (several ready outputs in one write), with its usage and metrics; and
what a choice that ended unserved means to the client (429, 503, 504 or 500)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from aiohttp import web

from local_backend.engine.loop import RequestOutput
from local_backend.engine.sampler import TokenLogprob
from local_backend.server.backend import DEADLINE_HEADER, RETRY_AFTER_S, Backend
from local_backend.server.errors import ApiError
from local_backend.server.protocol import ParsedRequest, ResponseBuilder, combined
from local_backend.server.timing import request_metrics, server_timing

ENGINE_FAILURES = ("error", "shutdown")


def unserved(final: RequestOutput) -> ApiError | None:
    """Why a choice that ended produced nothing the client can use, or None."""
    if final.finish_reason in ENGINE_FAILURES:
        return engine_failure(final.finish_reason)
    if final.finish_reason == "shed":  # only ever a request not yet started
        return ApiError(429, "the server is busy: requests of a better priority band took "
                        "this one's place in its queue", type_="rate_limit_error",
                        code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
    if final.finish_reason == "deadline" and not final.completion_tokens:
        return ApiError(504, f"the request's deadline ({DEADLINE_HEADER}) passed, or could not "
                        "be met at the server's pace, before it left the queue",
                        type_="server_error", code="deadline_exceeded")
    return None


def engine_failure(reason: str | None) -> ApiError:
    if reason == "shutdown":
        return ApiError(503, "the server is shutting down", type_="server_error",
                        code="shutting_down", headers={"Retry-After": str(RETRY_AFTER_S)})
    return ApiError(500, "the engine failed while generating", type_="server_error",
                    code="engine_error")


async def _next_batch(
    b: Backend, outputs: asyncio.Queue[RequestOutput], last_time: list[float]
) -> list[RequestOutput]:
    """Wait for one output, then take whatever else is ready (one write for several tokens)."""
    batch = [await outputs.get()]
    while not batch[-1].finished and not outputs.empty():
        batch.append(outputs.get_nowait())
    for out in batch:
        if last_time and out.token_ids:
            b.metrics.itl.observe(max(out.time - last_time[0], 0.0))
        if out.token_ids:
            last_time[:] = [out.time]
    return batch


async def _choice_batches(
    b: Backend, queues: list[asyncio.Queue[RequestOutput]],
) -> AsyncGenerator[tuple[int, list[RequestOutput]], None]:
    """(choice index, batch of its outputs) as they come, until every choice has ended.
    One choice (`n` = 1, the usual case) is read directly, without a task per batch."""
    last_times: list[list[float]] = [[] for _ in queues]
    if len(queues) == 1:
        while True:
            batch = await _next_batch(b, queues[0], last_times[0])
            yield 0, batch
            if batch[-1].finished:
                return
    waiting = {asyncio.ensure_future(_next_batch(b, outputs, last_times[i])): i
               for i, outputs in enumerate(queues)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for got in done:
                index = waiting.pop(got)
                batch = got.result()
                if not batch[-1].finished:
                    waiting[asyncio.ensure_future(
                        _next_batch(b, queues[index], last_times[index]))] = index
                yield index, batch
    finally:
        for got in waiting:
            got.cancel()


def finish(b: Backend, builder: ResponseBuilder, final: RequestOutput) -> dict[str, Any]:
    end = b.engine.clock()
    metrics = request_metrics(final, end)
    b.metrics.observe_request(metrics, final.finish_reason)
    builder.final, builder.end = final, end
    return metrics


async def complete(
    b: Backend, builder: ResponseBuilder, queues: list[asyncio.Queue[RequestOutput]]
) -> web.Response:
    texts: list[list[str]] = [[] for _ in queues]
    lps: list[list[TokenLogprob]] = [[] for _ in queues]
    ended: list[RequestOutput | None] = [None] * len(queues)
    async with contextlib.aclosing(_choice_batches(b, queues)) as batches:
        async for index, batch in batches:
            for out in batch:
                texts[index].append(out.text)
                lps[index].extend(out.logprobs)
            if batch[-1].finished:
                failure = unserved(batch[-1])
                if failure is not None:
                    raise failure
                ended[index] = batch[-1]
    finals = [last for last in ended if last is not None]  # every choice, once it ends
    final = combined(builder.id, finals)
    metrics = finish(b, builder, final)
    body = builder.full(
        [("".join(t), last, lp) for t, last, lp in zip(texts, finals, lps, strict=True)],
        final, metrics)
    return web.Response(body=orjson.dumps(body), content_type="application/json",
                        headers={"Server-Timing": server_timing(metrics)})


async def stream(
    request: web.Request, b: Backend, req: ParsedRequest, builder: ResponseBuilder,
    queues: list[asyncio.Queue[RequestOutput]],
) -> web.StreamResponse:
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Request-Id": builder.id,
    })
    await response.prepare(request)
    with contextlib.suppress(ConnectionResetError):  # client gone: the caller aborts
        await _relay(response, b, req, builder, queues)
    return response


async def _relay(
    response: web.StreamResponse, b: Backend, req: ParsedRequest, builder: ResponseBuilder,
    queues: list[asyncio.Queue[RequestOutput]],
) -> None:
    """Each choice's new text as it comes, tagged with its index; the request's usage
    and metrics with the last choice's end."""
    async def send(obj: dict[str, Any]) -> None:
        await response.write(b"data: " + orjson.dumps(obj) + b"\n\n")

    if req.chat:
        for index in range(len(queues)):
            await send(builder.chunk(None, first=True, index=index))
    finals: list[RequestOutput | None] = [None] * len(queues)
    async with contextlib.aclosing(_choice_batches(b, queues)) as batches:
        async for index, batch in batches:
            final = batch[-1] if batch[-1].finished else None
            failure = unserved(final) if final is not None else None
            if failure is not None:
                await send({"error": failure.body()})
                break
            text = "".join(o.text for o in batch)
            lps = [lp for o in batch for lp in o.logprobs]
            if not (text or lps or final is not None):
                continue
            merged = RequestOutput(builder.id, text, [], time.monotonic(), logprobs=lps,
                                   finished=final is not None,
                                   finish_reason=final.finish_reason if final else None)
            chunk = builder.chunk(merged, index=index)
            finals[index] = final
            if final is None or any(f is None for f in finals):
                await send(chunk)
                continue
            request_final = combined(builder.id, [f for f in finals if f is not None])
            metrics = finish(b, builder, request_final)
            if not req.include_usage:
                chunk["metrics"] = metrics
            await send(chunk)
            if req.include_usage:
                await send(builder.usage_chunk(request_final, metrics))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
