"""Picking a replica by what it holds: `pick: prefix` (estimated and `precise`) against
`least_busy` and `round_robin`, side by side in one run, on real local_backend replicas.

  replicas   `--replicas` (2) `python -m local_backend --model demo` children (one CPU
             thread each),
             each with a KV cache too small for every tenant's system prompt
             (`--num-blocks`), as a busy GPU's cache is
  trace      8 tenants, each with its own system prompt of `--system-tokens` tokens
             (the demo tokenizer is about one token a character), short user turns,
             interleaved at random, open loop (Poisson arrivals at `--rate` per second
             for `--duration` s), streamed, `max_tokens` 4
  per pick   the gateway in this process in front of the same two replicas; tenant
             names differ per pick (so do their cache salts), so no pick inherits a
             warm cache from the one before
  printed    cached-token share (cached ÷ prompt tokens, from usage), TTFT p50/p90,
             throughput (answers per second over the run), and prefix's ratios to
             round robin

With uniform tenants and LRU caches, round robin's share is about C/N of what is
cacheable (C prompts fit a replica's cache, N tenants) and prefix's about
min(1, R·C/N) (R replicas split the tenants), so prefix ÷ round robin is at most
min(N/C, R), less the first (cold) request of each tenant: with 2 replicas, under 2×.

    .venv/bin/python bench/fleet.py [--rate 0.6] [--duration 30] [--system-tokens 1100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import openai
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.app import create_app  # noqa: E402
from gateway.core.auth import key_hash  # noqa: E402
from gateway.server.runner import GatewayRunner  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from policies.load import loads  # noqa: E402

TENANTS = 8
PICKS = ("prefix", "prefix_precise", "least_busy", "round_robin")  # precise: pick prefix
WORDS = ["invoice", "ledger", "account", "balance", "refund", "order", "parcel", "courier",
         "warehouse", "customer", "policy", "return", "exchange", "voucher", "discount", "tax",
         "receipt", "payment"]


async def start_replica(port: int, num_blocks: int) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "local_backend", "--model", "demo", "--host", "127.0.0.1",
        "--port", str(port), "--threads", "1", "--num-blocks", str(num_blocks),
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    async with asyncio.timeout(120), aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/health") as response:
                    if response.status == 200:
                        return process
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.2)


def system_prompt(tenant: int, tokens: int) -> str:
    draw = random.Random(tenant)
    text = f"You are the assistant of shop number {tenant}. "
    while len(text) < tokens:
        text += draw.choice(WORDS) + " "
    return text[:tokens]


def policy_text(label: str, urls: list[str], cached_weight: float) -> str:
    tenants = "\n".join(f"  {label}-t{i}: {{api_keys: [{key_hash(f'{label}-t{i}')}]}}"
                        for i in range(TENANTS))
    pick, precise = label.removesuffix("_precise"), str(label.endswith("_precise")).lower()
    return f"""
version: 1
backends:
  fleet:
    type: openai
    deployment: dedicated
    urls: [{", ".join(urls)}]
    pick: {pick}
    fleet:
      poll_interval_s: 0.5
      prefix: {{block_chars: 64, cached_weight: {cached_weight}, precise: {precise}}}
    timeouts: {{first_byte_s: 120, total_s: 300}}
    models:
      demo: {{}}
routes:
  chat: {{targets: [fleet/demo]}}
tenants:
{tenants}
defaults:
  limits: {{requests_per_minute: 100000, tokens_per_minute: 100000000}}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def one(base_url: str, tenant: str, system: str, rng: random.Random,
              out: list[tuple[float, int, int]]) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=tenant, max_retries=0,
                                timeout=300)
    question = " ".join(rng.choice(WORDS) for _ in range(8)) + "?"
    started = time.perf_counter()
    ttft = None
    prompt = cached = 0
    stream = await client.chat.completions.create(
        model="chat", max_tokens=4, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - started
        if chunk.usage is not None:
            prompt = chunk.usage.prompt_tokens
            details = chunk.usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
    await client.close()
    out.append((ttft if ttft is not None else time.perf_counter() - started, prompt, cached))


async def run_pick(pick: str, urls: list[str], args: argparse.Namespace) -> dict[str, float]:
    app = create_app(loads(policy_text(pick, urls, args.cached_weight)), Settings(port=0))
    runner = GatewayRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    systems = [system_prompt(i, args.system_tokens) for i in range(TENANTS)]
    rng = random.Random(1)
    results: list[tuple[float, int, int]] = []
    tasks = []
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < args.duration:
            tenant = rng.randrange(TENANTS)
            tasks.append(asyncio.create_task(
                one(base_url, f"{pick}-t{tenant}", systems[tenant], rng, results)))
            await asyncio.sleep(rng.expovariate(args.rate))
        done = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - started
    finally:
        await runner.cleanup()
    failures = sum(isinstance(d, BaseException) for d in done)
    ttfts = sorted(r[0] for r in results)
    return {
        "requests": len(tasks), "failed": failures,
        "cached_share": sum(r[2] for r in results) / max(1, sum(r[1] for r in results)),
        "ttft_p50_s": statistics.median(ttfts) if ttfts else float("nan"),
        "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else float("nan"),
        "throughput_rps": len(results) / elapsed,
    }


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=0.6, help="arrivals per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per pick")
    parser.add_argument("--system-tokens", type=int, default=1100)
    parser.add_argument("--cached-weight", type=float, default=4.0,
                        help="`fleet.prefix.cached_weight` for pick: prefix")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--picks", default=",".join(PICKS),
                        help="which of " + ", ".join(PICKS) + " to run, in order")
    parser.add_argument("--num-blocks", type=int, default=400,
                        help="KV blocks of 16 tokens per replica (default: 6,400 tokens, "
                             "room for about half the tenants' system prompts)")
    args = parser.parse_args(argv)
    ports = [free_port() for _ in range(args.replicas)]
    replicas = await asyncio.gather(*(start_replica(port, args.num_blocks) for port in ports))
    urls = [f"http://127.0.0.1:{port}/v1" for port in ports]
    try:
        figures = {}
        for pick in args.picks.split(","):
            figures[pick] = await run_pick(pick, urls, args)
            print(pick, {k: round(v, 3) for k, v in figures[pick].items()}, flush=True)
    finally:
        for process in replicas:
            process.terminate()
            await process.wait()
    rr = figures.get("round_robin")
    for label in ("prefix", "prefix_precise"):
        prefix = figures.get(label)
        if prefix is None or rr is None:
            continue
        share = prefix["cached_share"] / max(rr["cached_share"], 1e-9)
        print(f"{label} / round_robin: cached share {share:.2f}x, "
              f"TTFT p90 {prefix['ttft_p90_s'] / rr['ttft_p90_s']:.2f}x, "
              f"throughput {prefix['throughput_rps'] / rr['throughput_rps']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
