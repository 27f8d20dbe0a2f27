"""Batches backfilling idle dedicated capacity, on a real engine, measured side by side.

    .venv/bin/python bench/backfill.py [--seconds 30] [--lines 400] [--lines 2000 ...]

Set-up (all on loopback): the gateway (`routegate serve`, its own process) in front of
a real `local_backend --model demo` (one CPU thread, a fresh process for each run, so
neither run inherits the other's prefix cache) and a shared mock that answers every
request after `SHARED_S`. The gateway holds `SLOTS` slots for the engine
(`max_concurrency`); batch lines take at most half of them, and only while no
interactive request waits (`batches.spare_queue_use`); they run in the `batch` band
(engine band 3), below every tenant's. `--local-url` runs against another dedicated
backend instead (vLLM, a local_backend already running; `--local-model` names its
model).

First the engine's capacity is measured: `SLOTS` requests at a time, closed loop, for
`CALIBRATE_S`. Two runs then see the same open-loop interactive trace (Poisson arrivals
at `LOAD` of that capacity, streamed chat of `TOKENS` tokens, TTFT at the client):
  1. the trace alone;
  2. the trace with a `--lines`-line batch submitted at its start.
The batch's completion window and spill margin are the issue's (2,000 lines in 120 s,
margin 20 s) scaled by `--lines` / 2,000, so a smaller batch faces the same deadline
pressure per line. Printed: interactive TTFT p50/p95 of each run and their ratio (the
claim: p95 with the batch ≤ 1.1× without), the engine's busy share during the trace
(its running requests, sampled from its /metrics, over `SLOTS`; and the share of samples
with any request running), its queue wait and preemptions by band, and the batch's
status, time, dedicated/shared split and cost against sending every line to the
cheapest shared target (the gateway's own report, `batch.routegate`).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.backfill_metrics import (
    by_band,
    engine_metrics,
    gateway_queue,
    queued,
    sample_running,
)
from bench.loadgen import cpu_seconds, free_port

ROOT = Path(__file__).resolve().parent.parent

SLOTS = 8
TOKENS = 16
SHARED_S = 0.150
LOAD = 0.35  # interactive arrivals, as a share of the engine's measured capacity
CALIBRATE_S = 4.0
REFERENCE_LINES, REFERENCE_WINDOW_S, REFERENCE_MARGIN_S = 2000, 120.0, 20.0


async def wait_ready(url: str, process: asyncio.subprocess.Process, what: str) -> None:
    async with asyncio.timeout(120), aiohttp.ClientSession() as session:
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"{what} exited during start-up")
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)


async def start_engine() -> tuple[asyncio.subprocess.Process, str]:
    """A fresh `local_backend --model demo`: its /health answers once it has warmed up."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "local_backend", "--model", "demo", "--host", "127.0.0.1",
        "--port", str(port), "--threads", "1", cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    await wait_ready(f"http://127.0.0.1:{port}/health", process, "local_backend")
    return process, f"http://127.0.0.1:{port}/v1"


async def start_shared() -> tuple[web.AppRunner, str]:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(SHARED_S)
        return web.json_response({
            "id": "s", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": "word " * TOKENS}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": TOKENS,
                      "total_tokens": 12 + TOKENS}})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_routes([web.post("/v1/chat/completions", chat), web.get("/health", health)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


def policy(local_url: str, local_model: str, shared_url: str, data_dir: Path,
           margin_s: float) -> str:
    return yaml.safe_dump({
        "version": 1,
        "backends": {
            "local": {"type": "openai", "url": local_url, "deployment": "dedicated",
                      "gpu_hour_usd": 2.0, "max_concurrency": SLOTS,
                      "models": {local_model: {}}},
            "cloud": {"type": "openai", "url": shared_url, "deployment": "shared",
                      "models": {"gpt-4o-mini": {"input_usd_per_mtok": 0.15,
                                                 "output_usd_per_mtok": 0.60},
                                 "gpt-4o-mini-batch": {"input_usd_per_mtok": 0.075,
                                                       "output_usd_per_mtok": 0.30}}}},
        "routes": {"chat": {"targets": [f"local/{local_model}", "cloud/gpt-4o-mini",
                                        "cloud/gpt-4o-mini-batch"],
                            "objective": "ordered"}},
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}},
        "defaults": {"limits": {"requests_per_minute": 10**7, "tokens_per_minute": 10**9}},
        "batches": {"data_dir": str(data_dir), "poll_interval_s": 0.1,
                    "spill_margin_s": margin_s, "lines_in_flight": SLOTS,
                    "routes": {"chat": {"spill_to": ["cloud/gpt-4o-mini-batch"]}}},
    })


async def start_gateway(policy_path: Path) -> tuple[asyncio.subprocess.Process, str]:
    """`routegate serve` in its own process: the batch's work in the gateway competes with
    the interactive requests' there, not with this process's load generator."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTEGATE_", "OTEL_"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--policy", str(policy_path), "--port",
        str(port), cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    await wait_ready(url + "/healthz", process, "the gateway")
    return process, url + "/v1"


def chat_body(model: str, text: str, stream: bool) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream,
            "max_tokens": TOKENS, "ignore_eos": True}


async def capacity_rps(local_url: str, model: str) -> float:
    """Replies per second with `SLOTS` requests at a time (closed loop)."""
    done, end = 0, time.perf_counter() + CALIBRATE_S
    async with aiohttp.ClientSession() as session:
        async def worker(w: int) -> None:
            nonlocal done
            while time.perf_counter() < end:
                body = chat_body(model, f"calibrate {w} {done}", stream=False)
                async with session.post(local_url + "/chat/completions", json=body) as reply:
                    await reply.read()
                    done += reply.status == 200
        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(SLOTS)))
    return done / (time.perf_counter() - started)


async def interactive(base_url: str, model: str, rate: float, seconds: float,
                      seed: int) -> list[float]:
    """TTFT (s) of each streamed request of the open-loop trace."""
    rng = random.Random(seed)
    times, at = [], 0.0
    while (at := at + rng.expovariate(rate)) < seconds:
        times.append(at)
    ttfts: list[float] = []
    async with aiohttp.ClientSession() as session:
        async def one(n: int, delay: float) -> None:
            await asyncio.sleep(delay)
            sent = time.perf_counter()
            body = chat_body(model, f"interactive question {n}", stream=True)
            async with session.post(base_url + "/chat/completions", json=body) as response:
                async for line in response.content:
                    if first_text(line):  # not the opening chunk's role (empty content)
                        ttfts.append(time.perf_counter() - sent)
                        break
                await response.read()
        await asyncio.gather(*(one(n, at) for n, at in enumerate(times)))
    return ttfts


def first_text(line: bytes) -> bool:
    """Whether an SSE line is a chunk carrying some of the answer's text."""
    if not line.startswith(b"data: {"):
        return False
    choices = orjson.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def percentile(values: list[float], share: float) -> float:
    return statistics.quantiles(values, n=100)[int(share * 100) - 1] if len(values) > 1 \
        else values[0]


async def submit_batch(client: openai.AsyncOpenAI, lines: int, window: str) -> str:
    data = b"".join(orjson.dumps({
        "custom_id": f"l{n}", "method": "POST", "url": "/v1/chat/completions",
        "body": chat_body("chat", f"summarise document {n}", stream=False)}) + b"\n"
        for n in range(lines))
    file = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return (await client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions",
        completion_window=window)).id  # type: ignore[arg-type]


async def run(args: argparse.Namespace, rate: float | None, with_batch: bool
              ) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        local_url = args.local_url
        if local_url is None:
            engine, local_url = await start_engine()
            stack.push_async_callback(_stop, engine)
        if rate is None:
            rate = LOAD * await capacity_rps(local_url, args.local_model)
        shared_runner, shared_url = await start_shared()
        stack.push_async_callback(shared_runner.cleanup)
        data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        policy_path = data_dir / "policy.yaml"
        policy_path.write_text(policy(local_url, args.local_model, shared_url,
                                      data_dir / "data", args.margin_s))
        gateway, base_url = await start_gateway(policy_path)
        stack.push_async_callback(_stop, gateway)
        client = openai.AsyncOpenAI(base_url=base_url, api_key="anonymous", max_retries=0)
        async with aiohttp.ClientSession() as session:
            before = await engine_metrics(session, local_url)
            queue_before = await gateway_queue(session, base_url)
        started = time.perf_counter()
        batch_id = await submit_batch(client, args.lines, args.window) if with_batch else None
        cpu_before, stop = cpu_seconds(gateway.pid), asyncio.Event()
        sampler = asyncio.create_task(sample_running(local_url, stop))
        ttfts = await interactive(base_url, "chat", rate, args.seconds, seed=11)
        stop.set()
        running = await sampler
        async with aiohttp.ClientSession() as session:
            after = await engine_metrics(session, local_url)
            queue_after = await gateway_queue(session, base_url)
        result: dict[str, Any] = {
            "rate": rate, "requests": len(ttfts),
            "gateway_cpu": (cpu_seconds(gateway.pid) - cpu_before)
            / (time.perf_counter() - started),
            "ttft_p50_ms": percentile(ttfts, 0.50) * 1000,
            "ttft_p95_ms": percentile(ttfts, 0.95) * 1000,
            "busy_share": statistics.fmean(running) / SLOTS,
            "any_running": sum(r > 0 for r in running) / len(running),
            "engine": {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after},
            "gateway_queue": {key: value - queue_before.get(key, 0.0)
                              for key, value in queue_after.items()}}
        if batch_id is not None:
            while True:  # polled, as a client of the Batch API does
                batch = await client.batches.retrieve(batch_id)
                if batch.status in ("completed", "failed", "expired", "cancelled"):
                    break
                await asyncio.sleep(0.2)
            result["batch"] = batch
            result["batch_s"] = (batch.completed_at or time.time()) - batch.created_at
    return result


async def _stop(process: asyncio.subprocess.Process) -> None:
    process.terminate()
    try:
        async with asyncio.timeout(20):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


def report(alone: dict[str, Any], both: dict[str, Any], window: str) -> None:
    for name, figures in (("trace alone", alone), ("trace + batch", both)):
        print(f"{name:14s} interactive TTFT p50 {figures['ttft_p50_ms']:.1f} ms, "
              f"p95 {figures['ttft_p95_ms']:.1f} ms ({figures['requests']} requests); "
              f"engine busy {figures['busy_share']:.0%} of {SLOTS} slots (any request "
              f"running {figures['any_running']:.0%} of the time); gateway CPU "
              f"{figures['gateway_cpu']:.0%} of a core")
        print(f"{'':14s} engine during the trace: {by_band(figures['engine'])}")
        print(f"{'':14s} gateway queue for the engine: {queued(figures['gateway_queue'])}")
    print(f"p95 TTFT with the batch / without: "
          f"{both['ttft_p95_ms'] / alone['ttft_p95_ms']:.2f}× (claim: ≤ 1.10×)")
    print(f"engine busy share before / after the batch: {alone['busy_share']:.0%} / "
          f"{both['busy_share']:.0%}")
    batch = both["batch"]
    split = (batch.model_extra or {}).get("routegate", {})
    within = batch.status == "completed" and batch.completed_at is not None \
        and batch.expires_at is not None and batch.completed_at <= batch.expires_at
    print(f"batch {batch.status} in {both['batch_s']:.0f} s (window {window}): "
          f"{'within' if within else 'NOT within'} its window; counts {batch.request_counts}")
    print(f"  dedicated {split['dedicated']}, shared {split['shared']}")
    print(f"  ledger cost {split['cost_micros'] / 1e6:.4f} USD (dedicated at its amortised "
          f"GPU-hour price) vs all-shared {split['all_shared_cost_micros'] / 1e6:.4f} USD; "
          f"per-token spend {split['shared']['cost_micros'] / 1e6:.4f} USD, saving "
          f"{split['spend_saving_micros'] / 1e6:.4f} USD "
          f"({split['spend_saving_micros'] / max(1, split['all_shared_cost_micros']):.0%})")


async def main(args: argparse.Namespace) -> None:
    scale = args.lines / REFERENCE_LINES
    window_s = round(REFERENCE_WINDOW_S * scale)
    args.window = args.window or f"{max(1, window_s)}s"
    args.margin_s = args.margin_s if args.margin_s is not None else REFERENCE_MARGIN_S * scale
    alone = await run(args, None, with_batch=False)
    print(f"dedicated: {args.local_url or 'local_backend --model demo (1 CPU thread)'}, "
          f"{SLOTS} gateway slots, measured {alone['rate'] / LOAD:.1f} replies/s of "
          f"{TOKENS} tokens; interactive at {LOAD:.0%} of that ({alone['rate']:.1f}/s) for "
          f"{args.seconds:.0f} s; shared mock {SHARED_S * 1000:.0f} ms; batch {args.lines} "
          f"lines, window {args.window}, spill margin {args.margin_s:.1f} s")
    both = await run(args, alone["rate"], with_batch=True)
    report(alone, both, args.window)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0, help="the interactive trace")
    parser.add_argument("--lines", type=int, default=400,
                        help="batch lines (the issue's figure: 2000)")
    parser.add_argument("--window", default=None,
                        help="completion window (default: 120s × lines / 2000)")
    parser.add_argument("--margin-s", type=float, default=None,
                        help="spill margin (default: 20 s × lines / 2000)")
    parser.add_argument("--local-url", default=None,
                        help="a running dedicated backend's /v1 URL instead of a fresh "
                        "local_backend per run")
    parser.add_argument("--local-model", default="demo", help="its model's name")
    asyncio.run(main(parser.parse_args()))
