"""What the gateway adds on top of talking to the backend directly, measured side by side.

One run on loopback starts a fast fake upstream, a bare aiohttp pass-through proxy (the
Python floor) and `routegate serve` (auth, routing and rate limits on), and measures
for each of direct / bare proxy / routegate:

  throughput at concurrency 1, 16, 64 (non-streaming chat completions)
  p50 / p99 latency, and what each proxy adds over direct, at concurrency 1 and 64 and
    at a steady 20 and 500 req/s (open loop: latency counts from when a request was due)
  streaming time to first byte (first SSE event) at concurrency 1
  CPU time per request of the process under test (robust to other load on the machine),
    for whole JSON responses (concurrency 16, 64) and streams (concurrency 16)
  peak RSS of each proxy process
Two more routegate processes show what the plug-ins cost, each with some of them swapped
for the pipeline's defaults (auth, parsing, telemetry and the relay always stay):
"auth+routing" has no rate limits and no queues (the configuration the core targets
name), "rg core" has no routing decision either (route targets in order).

The proxies are pinned to core 0 with `taskset` when available; the upstream and this
load generator (a minimal keep-alive HTTP/1.1 client, cheaper than aiohttp's) run on
the other cores. Only one proxy runs at a time. Request counts are bounded so a run
takes well under two minutes.

    .venv/bin/python bench/overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loadgen import (
    KEY,
    Result,
    cpu_seconds,
    free_port,
    load,
    paced,
    peak_rss_mb,
    pinned,
    wait_listening,
)

ROOT = Path(__file__).resolve().parent.parent

CHAT_REPLY = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"m",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how can I '
    b'help?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":7,'
    b'"total_tokens":16}}')
STREAM_EVENTS = b"".join(
    b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"' + word + b'"},"finish_reason":null}]}\n\n'
    for word in (b"Hello", b" there", b" how", b" can", b" I", b" help")) + (
    b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":6,"total_tokens":15}}\n\n'
    b"data: [DONE]\n\n")


# --- processes under test -------------------------------------------------------------

def run_upstream(port: int) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' in body or b'"stream": true' in body:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(STREAM_EVENTS)
            await response.write_eof()
            return response
        return web.Response(body=CHAT_REPLY, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    _run_app(app, port)


def run_bare_proxy(port: int, upstream: str) -> None:
    """The floor: forward body and reply bytes, nothing else (no auth, parsing, limits)."""
    import aiohttp
    from aiohttp import web

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        yield
        await app["session"].close()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        session: aiohttp.ClientSession = request.app["session"]
        async with session.post(upstream + "/chat/completions", data=body,
                                headers={"Content-Type": "application/json"}) as upstream_reply:
            if upstream_reply.content_type == "text/event-stream":
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                async for chunk in upstream_reply.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
            return web.Response(body=await upstream_reply.read(), status=upstream_reply.status,
                                content_type="application/json")

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", chat)
    _run_app(app, port)


# The gateway variants: name → the plug-ins swapped for the pipeline's defaults.
VARIANTS = {"auth+routing": ("admission", "queue"), "rg core": ("admission", "queue", "router")}


def run_gateway_variant(port: int, policy_path: str, without: tuple[str, ...]) -> None:
    """routegate with the `without` hooks (`admission`, `queue`, `router`) swapped for the
    pipeline's defaults (no admission, no queue, route targets in order): what those
    plug-ins cost. Auth, parsing, the relay and telemetry stay."""
    # bench/ is on sys.path as this script's folder, and bench/routing.py would shadow
    # the `routing` package.
    here = Path(__file__).resolve().parent
    sys.path[:] = [str(ROOT)] + [e for e in sys.path if Path(e or ".").resolve() != here]
    import uvloop

    from gateway.api.openai import PIPELINE
    from gateway.app import create_app
    from gateway.plugin import Hooks
    from gateway.server.serve import serve
    from gateway.settings import Settings
    from policies.load import load

    settings = Settings(port=port, policy_path=Path(policy_path))
    app = create_app(load(policy_path), settings)
    pipeline, defaults = app[PIPELINE], Hooks()
    pipeline.hooks = dataclasses.replace(
        pipeline.hooks, **{hook: getattr(defaults, hook) for hook in without})
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(app, settings))


def _run_app(app: object, port: int) -> None:
    import uvloop
    from aiohttp import web

    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None,  # type: ignore[arg-type]
                print=None, handler_cancellation=True)


def routegate_policy(upstream: str) -> str:
    key_hash = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()
    return f"""version: 1
backends:
  fast:
    type: openai
    url: {upstream}
    models: {{m: {{}}}}
routes:
  chat: {{targets: [fast/m]}}
tenants:
  bench:
    api_keys: ["{key_hash}"]
    limits: {{requests_per_minute: 100000000, tokens_per_minute: 1000000000}}
defaults:
  limits: {{requests_per_minute: 100000000, tokens_per_minute: 1000000000}}
"""


# Steady rates: req/s → (requests, connections). 20 req/s is an application's trickle,
# 500 about a third of what the bare proxy serves on one core here.
RATES = {20: (200, 4), 500: (2500, 32)}


async def measure(port: int, pid: int, counts: dict[int, int], stream_count: int,
                  scale: float, authorized: bool) -> dict[str, Result]:
    await load(port, 16, 400, authorized=authorized)  # warm-up: connections, caches
    await load(port, 1, 50, stream=True, authorized=authorized)

    async def timed(run: Awaitable[Result]) -> Result:
        before = cpu_seconds(pid)
        result = await run
        result.cpu_us = (cpu_seconds(pid) - before) * 1e6 / len(result.latencies_ms)
        return result

    results = {}
    for c, n in counts.items():
        results[f"c{c}"] = await timed(load(port, c, n, authorized=authorized))
    results["stream"] = await load(port, 1, stream_count, stream=True, authorized=authorized)
    results["stream c16"] = await timed(load(port, 16, 4 * stream_count, stream=True,
                                             authorized=authorized))
    for rate, (n, connections) in RATES.items():
        results[f"{rate}/s"] = await timed(paced(port, rate, max(connections, int(n * scale)),
                                                 connections=connections,
                                                 authorized=authorized))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("role", nargs="?", choices=["upstream", "bare-proxy", "gateway-variant"])
    parser.add_argument("--variant", choices=list(VARIANTS))
    parser.add_argument("--policy")
    parser.add_argument("--port", type=int)
    parser.add_argument("--upstream")
    args = parser.parse_args(argv)
    if args.role == "upstream":
        run_upstream(args.port)
        return 0
    if args.role == "bare-proxy":
        run_bare_proxy(args.port, args.upstream)
        return 0
    if args.role == "gateway-variant":
        run_gateway_variant(args.port, args.policy, VARIANTS[args.variant])
        return 0

    scale = 0.2 if args.quick else 1.0
    counts = {1: int(600 * scale), 16: int(2000 * scale), 64: int(2560 * scale)}
    stream_count = int(500 * scale)
    others = "1" if (os.cpu_count() or 1) == 2 else f"1-{(os.cpu_count() or 2) - 1}"
    python = sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], port: int, cores: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(pinned(command, cores), env=env, cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.append(process)
        wait_listening(port, process)
        return process

    rounds: list[dict[str, dict[str, Result]]] = []
    rss: dict[str, float] = {}
    policy_path = Path(tempfile.mkstemp(suffix=".yaml")[1])
    try:
        upstream_port = free_port()
        up = start([python, __file__, "upstream", "--port", str(upstream_port)], upstream_port,
                   others)
        upstream = f"http://127.0.0.1:{upstream_port}/v1"
        policy_path.write_text(routegate_policy(upstream))
        proxies: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
        port = free_port()
        proxies["bare proxy"] = port, start(
            [python, __file__, "bare-proxy", "--port", str(port), "--upstream", upstream],
            port, "0")
        port = free_port()
        proxies["routegate"] = port, start(
            [python, "-m", "gateway", "serve", "--policy", str(policy_path), "--port",
             str(port)], port, "0")
        for variant in VARIANTS:
            port = free_port()
            proxies[variant] = port, start(
                [python, __file__, "gateway-variant", "--variant", variant, "--port", str(port),
                 "--policy", str(policy_path)], port, "0")
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {int(others.split("-")[0])})  # the load generator
        # The proxies idle on core 0 while another is measured; the rounds interleave so
        # that noise from anything else on the machine hits them all alike.
        for _ in range(args.rounds):
            one = {"direct": asyncio.run(measure(upstream_port, up.pid, counts, stream_count,
                                                 scale, False))}
            for name, (port, process) in proxies.items():
                one[name] = asyncio.run(measure(port, process.pid, counts, stream_count,
                                                scale, name != "bare proxy"))
            rounds.append(one)
        for name, (_, process) in proxies.items():
            rss[name] = peak_rss_mb(process.pid)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(10)
        policy_path.unlink(missing_ok=True)
    report(rounds, rss)
    return 0


def report(rounds: list[dict[str, dict[str, Result]]], rss: dict[str, float]) -> None:
    names = list(rounds[0])
    gateways = names[2:]  # after direct and the bare proxy

    def metric(name: str, key: str, q: float | None = None, first: bool = False,
               cpu: bool = False) -> float:
        """Median over rounds of one figure (throughput when q is None)."""
        values = [r[name][key].cpu_us if cpu else r[name][key].rps if q is None
                  else r[name][key].pct(q, first) for r in rounds]
        return statistics.median(values)

    print(f"\nmedian of {len(rounds)} interleaved rounds; the last columns: each routegate "
          "variant / the bare proxy")
    print(f"{'':36}" + "".join(f"{name:>13}" for name in names)
          + "".join(f"{name[:11]:>12}" for name in gateways))

    def row(label: str, values: list[float], fmt: str) -> None:
        print(f"{label:36}" + "".join(fmt.format(v) for v in values)
              + "".join(f"{v / values[1]:>12.2f}" for v in values[2:]))

    for c in (1, 16, 64):
        row(f"throughput req/s, concurrency {c}", [metric(n, f"c{c}") for n in names],
            "{:>13.0f}")
    def label(key: str) -> str:  # "c16" → "concurrency 16", "stream c16", "500/s"
        kind, _, count = key.rpartition("c")
        return f"{kind}concurrency {count}" if count.isdigit() else key

    for key in ("c16", "c64", "stream c16", *(f"{rate}/s" for rate in RATES)):
        row(f"CPU us per request, {label(key)}", [metric(n, key, cpu=True) for n in names],
            "{:>13.0f}")
    for key in ("c1", "c64", *(f"{rate}/s" for rate in RATES)):
        for q in (0.5, 0.99):
            row(f"latency p{int(q * 100)} ms, {label(key)}",
                [metric(n, key, q) for n in names], "{:>13.3f}")
    for q in (0.5, 0.99):
        row(f"stream first byte p{int(q * 100)} ms, conc. 1",
            [metric(n, "stream", q, True) for n in names], "{:>13.3f}")
    print(f"{'peak RSS MB':36}{'':>13}" + "".join(f"{rss[n]:>13.1f}" for n in names[1:]))

    print(f"\n{'added over direct (ms)':36}" + "".join(f"{n:>13}" for n in names[1:])
          + "".join(f"{'- bare':>12}" for _ in gateways))
    steady = [(f"p{int(q * 100)} latency, {rate} req/s", f"{rate}/s", q, False)
              for rate in RATES for q in (0.5, 0.99)]
    for label, key, q, first in (("p50 latency, concurrency 1", "c1", 0.5, False),
                                 ("p99 latency, concurrency 1", "c1", 0.99, False),
                                 *steady,
                                 ("p50 stream first byte, conc. 1", "stream", 0.5, True),
                                 ("p99 latency, concurrency 64", "c64", 0.99, False)):
        direct = metric("direct", key, q, first)
        added = [metric(n, key, q, first) - direct for n in names[1:]]
        print(f"{label:36}" + "".join(f"{a:>13.3f}" for a in added)
              + "".join(f"{a - added[0]:>12.3f}" for a in added[1:]))


if __name__ == "__main__":
    sys.exit(main())
