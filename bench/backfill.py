"""Batches backfilling idle dedicated capacity, measured side by side in one run.

    .venv/bin/python bench/backfill.py [--seconds 30] [--lines 2000] [--window 120s]

Set-up (all on loopback): the gateway (`routegate serve`, its own process) in front of
a dedicated backend and a shared mock. The dedicated backend is a model of an engine
(`--local-url` runs against a real one instead, e.g. local_backend or vLLM): `SLOTS`
sequences at a time, waiting requests served by priority band (`x-routegate-priority`,
lower first; a running sequence of a worse band gives its slot to a better waiter at its
next step, as local_backend and vLLM preempt), a reply of `TOKENS` tokens after
`PREFILL_S`, one every `DECODE_S`, streamed when asked. The shared mock answers every
request after `SHARED_S`.

Two runs see the same open-loop interactive trace (Poisson arrivals at `LOAD` of the
dedicated backend's capacity, streamed chat, TTFT measured at the client):
  1. the trace alone;
  2. the trace with a `--lines`-line batch submitted at its start (window `--window`).
Printed: interactive TTFT p50/p95 of each run and their ratio (the claim: p95 with the
batch ≤ 1.1× without), the dedicated backend's busy share (slot-seconds in use over
slot-seconds available) during the trace in each run, and the batch's status, time to
complete, its dedicated/shared split and its cost against sending every line to the
cheapest shared target (the gateway's own report, `batch.routegate`).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import io
import itertools
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import yaml
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent


SLOTS = 8
PREFILL_S = 0.030
DECODE_S = 0.004
TOKENS = 24
SHARED_S = 0.150
LOAD = 0.35  # interactive arrivals, as a share of the dedicated backend's capacity
SERVICE_S = PREFILL_S + TOKENS * DECODE_S


@dataclass
class Engine:
    """`SLOTS` sequences at once; waiters by (band, arrival); a running sequence of a worse
    band than the best waiter preempted at its next step; busy slot-seconds counted."""

    slots: int = SLOTS
    in_use: int = 0
    waiting: list[tuple[int, int, asyncio.Future[None]]] = field(default_factory=list)
    order: itertools.count[int] = field(default_factory=itertools.count)
    busy_s: float = 0.0
    preempted: int = 0
    waited_s: dict[int, list[float]] = field(default_factory=dict)  # band → waits for a slot
    changed_at: float = field(default_factory=time.perf_counter)

    def _account(self) -> None:
        now = time.perf_counter()
        self.busy_s += self.in_use * (now - self.changed_at)
        self.changed_at = now

    async def acquire(self, band: int) -> None:
        if self.in_use < self.slots and not self.waiting:
            self._account()
            self.in_use += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiting, (band, next(self.order), future))
        queued = time.perf_counter()
        await future
        self.waited_s.setdefault(band, []).append(time.perf_counter() - queued)

    def release(self) -> None:
        self._account()
        if self.waiting:  # the slot passes straight to the best waiter
            heapq.heappop(self.waiting)[2].set_result(None)
        else:
            self.in_use -= 1

    def better_waiting(self, band: int) -> bool:
        return bool(self.waiting) and self.waiting[0][0] < band

    async def step(self, band: int) -> None:
        """Between two decode steps: a sequence of a worse band than the best waiter
        gives its slot up and queues again (preempted; its KV recomputed on return)."""
        if self.better_waiting(band):
            self.preempted += 1
            self.release()
            await self.acquire(band)
            await asyncio.sleep(PREFILL_S)  # recompute what it had

    def busy_share(self, since_busy_s: float, since: float) -> float:
        self._account()
        return (self.busy_s - since_busy_s) / (self.slots * (time.perf_counter() - since))


def chunk(content: str | None, finish: str | None, usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                            "model": "m", "choices": [{"index": 0, "delta": {} if content is None
                                                       else {"content": content},
                                                       "finish_reason": finish}]}
    if usage is not None:
        body["choices"], body["usage"] = [], usage
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def start_engine(engine: Engine) -> tuple[web.AppRunner, str]:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        band = int(request.headers.get("x-routegate-priority", "1"))
        usage = {"prompt_tokens": 12, "completion_tokens": TOKENS, "total_tokens": 12 + TOKENS}
        await engine.acquire(band)
        try:
            await asyncio.sleep(PREFILL_S)
            if not body.get("stream"):
                for _ in range(TOKENS):
                    await engine.step(band)
                    await asyncio.sleep(DECODE_S)
                return web.json_response({
                    "id": "c", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant", "content": "word " * TOKENS}}], "usage": usage})
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for _ in range(TOKENS):
                await engine.step(band)
                await response.write(chunk("word ", None))
                await asyncio.sleep(DECODE_S)
            await response.write(chunk(None, "stop"))
            await response.write(chunk(None, None, usage))
            await response.write(b"data: [DONE]\n\n")
            return response
        finally:
            engine.release()

    return await _serve(web.post("/v1/chat/completions", chat))


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def start_shared() -> tuple[web.AppRunner, str]:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(SHARED_S)
        return web.json_response({
            "id": "s", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "word " * TOKENS}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": TOKENS,
                      "total_tokens": 12 + TOKENS}})

    return await _serve(web.post("/v1/chat/completions", chat))


async def _serve(route: web.RouteDef) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_routes([route, web.get("/health", health)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


def policy(local_url: str, shared_url: str, data_dir: Path) -> str:
    return yaml.safe_dump({
        "version": 1,
        "backends": {
            "local": {"type": "openai", "url": local_url, "deployment": "dedicated",
                      "gpu_hour_usd": 2.0, "max_concurrency": SLOTS,
                      "models": {"llama": {}}},
            "cloud": {"type": "openai", "url": shared_url, "deployment": "shared",
                      "models": {"gpt-4o-mini": {"input_usd_per_mtok": 0.15,
                                                 "output_usd_per_mtok": 0.60},
                                 "gpt-4o-mini-batch": {"input_usd_per_mtok": 0.075,
                                                       "output_usd_per_mtok": 0.30}}}},
        "routes": {"chat": {"targets": ["local/llama", "cloud/gpt-4o-mini",
                                        "cloud/gpt-4o-mini-batch"],
                            "objective": "ordered"}},
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}},
        "defaults": {"limits": {"requests_per_minute": 10**7, "tokens_per_minute": 10**9}},
        "batches": {"data_dir": str(data_dir), "poll_interval_s": 0.1,
                    "spill_margin_s": 20.0, "lines_in_flight": SLOTS,
                    "routes": {"chat": {"spill_to": ["cloud/gpt-4o-mini-batch"]}}},
    })


async def start_gateway(policy_path: Path) -> tuple[asyncio.subprocess.Process, str]:
    """`routegate serve` in its own process: the batch's work in the gateway competes with
    the interactive requests' there, not with this process's load generator."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTEGATE_", "OTEL_"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--policy", str(policy_path), "--port",
        str(port), cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(url + "/healthz") as response:
                    if response.status == 200:
                        return process, url + "/v1"
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    raise RuntimeError("the gateway did not start")


async def interactive(base_url: str, seconds: float, seed: int) -> list[float]:
    """TTFT (s) of each streamed request of the open-loop trace."""
    rng = random.Random(seed)
    rate = LOAD * SLOTS / SERVICE_S
    times, at = [], 0.0
    while (at := at + rng.expovariate(rate)) < seconds:
        times.append(at)
    ttfts: list[float] = []
    body = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async def one(delay: float) -> None:
            await asyncio.sleep(delay)
            sent = time.perf_counter()
            async with session.post(base_url + "/chat/completions", json=body) as response:
                async for line in response.content:
                    if line.startswith(b"data: ") and b'"content"' in line:
                        ttfts.append(time.perf_counter() - sent)
                        break
                await response.read()
        await asyncio.gather(*(one(at) for at in times))
    return ttfts


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], share: float) -> float:
    return statistics.quantiles(values, n=100)[int(share * 100) - 1] if len(values) > 1 \
        else values[0]


async def run(seconds: float, lines: int, window: str, local_url: str | None,
              with_batch: bool) -> dict[str, Any]:
    engine = Engine()
    engine_runner = None
    if local_url is None:
        engine_runner, local_url = await start_engine(engine)
    shared_runner, shared_url = await start_shared()
    with tempfile.TemporaryDirectory() as data_dir:
        policy_path = Path(data_dir) / "policy.yaml"
        policy_path.write_text(policy(local_url, shared_url, Path(data_dir) / "data"))
        gateway, base_url = await start_gateway(policy_path)
        client = openai.AsyncOpenAI(base_url=base_url, api_key="anonymous", max_retries=0)
        try:
            batch_id = None
            started, busy_at = time.perf_counter(), engine.busy_s
            if with_batch:
                data = b"".join(orjson.dumps({
                    "custom_id": f"l{n}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "chat", "messages": [
                        {"role": "user", "content": f"summarise document {n}"}]}}) + b"\n"
                    for n in range(lines))
                file = await client.files.create(file=("in.jsonl", io.BytesIO(data)),
                                                 purpose="batch")
                batch_id = (await client.batches.create(
                    input_file_id=file.id, endpoint="/v1/chat/completions",
                    completion_window=window)).id  # type: ignore[arg-type]
            cpu_before = cpu_s(gateway.pid)
            ttfts = await interactive(base_url, seconds, seed=11)
            result: dict[str, Any] = {
                "gateway_cpu": (cpu_s(gateway.pid) - cpu_before) / (time.perf_counter() - started),
                "ttft_p50_ms": percentile(ttfts, 0.50) * 1000,
                "ttft_p95_ms": percentile(ttfts, 0.95) * 1000, "requests": len(ttfts),
                "busy_share": engine.busy_share(busy_at, started),
                "preempted": engine.preempted,
                "interactive_waits": engine.waited_s.get(1, [])}
            if batch_id is not None:
                while True:  # polled, as a client of the Batch API does
                    batch = await client.batches.retrieve(batch_id)
                    if batch.status in ("completed", "failed", "expired", "cancelled"):
                        break
                    await asyncio.sleep(0.2)
                result["batch"] = batch
                result["batch_s"] = (batch.completed_at or time.time()) - batch.created_at
        finally:
            gateway.terminate()
            await gateway.wait()
            await shared_runner.cleanup()
            if engine_runner is not None:
                await engine_runner.cleanup()
    return result


async def main(seconds: float, lines: int, window: str, local_url: str | None,
               repeats: int) -> None:
    print(f"dedicated: {SLOTS} slots × {SERVICE_S * 1000:.0f} ms a reply "
          f"({SLOTS / SERVICE_S:.0f} replies/s); interactive at {LOAD:.0%} of that for "
          f"{seconds:.0f} s; shared mock {SHARED_S * 1000:.0f} ms; batch {lines} lines, "
          f"window {window}")
    ratios = []
    for _ in range(repeats):  # pairs, interleaved: the machine's drift hits both alike
        alone = await run(seconds, lines, window, local_url, with_batch=False)
        both = await run(seconds, lines, window, local_url, with_batch=True)
        for name, figures in (("trace alone", alone), ("trace + batch", both)):
            print(f"{name:14s} interactive TTFT p50 {figures['ttft_p50_ms']:.1f} ms, "
                  f"p95 {figures['ttft_p95_ms']:.1f} ms ({figures['requests']} requests); "
                  f"dedicated busy {figures['busy_share']:.0%}, gateway CPU "
                  f"{figures['gateway_cpu']:.0%} of a core, "
                  f"{figures['preempted']} preemptions; interactive requests that waited "
                  f"for a slot: {len(figures['interactive_waits'])}")
        ratios.append(both["ttft_p95_ms"] / alone["ttft_p95_ms"])
        print(f"p95 TTFT with the batch / without: {ratios[-1]:.2f}× (claim: ≤ 1.10×)")
        report_batch(both, window)
    if repeats > 1:
        print(f"p95 ratio over {repeats} pairs: median {statistics.median(ratios):.2f}×, "
              f"range {min(ratios):.2f}–{max(ratios):.2f}×")


def report_batch(both: dict[str, Any], window: str) -> None:
    batch = both["batch"]
    report = (batch.model_extra or {}).get("routegate", {})
    print(f"batch {batch.status} in {both['batch_s']:.0f} s (window {window}); counts "
          f"{batch.request_counts}")
    print(f"  dedicated {report['dedicated']}, shared {report['shared']}")
    print(f"  ledger cost {report['cost_micros'] / 1e6:.4f} USD (dedicated at its amortised "
          f"GPU-hour price) vs all-shared {report['all_shared_cost_micros'] / 1e6:.4f} USD; "
          f"per-token spend {report['shared']['cost_micros'] / 1e6:.4f} USD, saving "
          f"{report['spend_saving_micros'] / 1e6:.4f} USD "
          f"({report['spend_saving_micros'] / max(1, report['all_shared_cost_micros']):.0%})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--window", default="120s")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs")
    parser.add_argument("--local-url", default=None,
                        help="a real dedicated backend's /v1 URL instead of the model")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.lines, args.window, args.local_url, args.repeats))
