"""`python -m tests.chaos [--short]`: the chaos suite's table (see `suite.py`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import yaml

from tests.chaos.scenarios import SCENARIOS
from tests.chaos.suite import HEADER, TOLERANCE, Chaos, Line, policy, running_gateway, wait_ready
from tests.chaos.upstream import ChaosUpstream
from tests.delay_proxy import DelayProxy
from tests.redis_server import RedisServer, find_redis_server

WARM_UP = 200  # requests of every plain kind before the starting figures are taken
# run once before the starting figures too: the heap the busiest of them grows
# (buffers, a connection's objects) is kept by the allocator for the next, not leaked
# the full form only: the local backend's first start (torch, the model) takes longer
# than the whole short form
FULL_ONLY = ("local backend killed mid-stream",)
WARM_UP_SCENARIOS = ("client never reads", "too many connections", "oversized reply",
                     "client sends 5 MB")


async def run_suite(short: bool, workdir: Path, out: list[Line]) -> tuple[float, int]:
    """Every scenario, its line appended to `out` (and printed) as it ends; returns
    the starting (RSS MiB, fds)."""
    upstream = ChaosUpstream()
    port = await upstream.start()
    binary = find_redis_server()
    redis = RedisServer(binary, workdir) if binary else None
    proxy = None
    if redis is not None:
        redis.start()
        # the gateway reaches Redis through a proxy that can move it far away (slow Redis)
        proxy = DelayProxy(redis.port)
        await proxy.start()
    try:
        pooled = frozenset({port, *([redis.port] if redis else []),
                            *([proxy.port] if proxy else [])})
        text = yaml.safe_dump(policy(port, proxy.url if proxy else None,
                                     launch_local=not short))
        with running_gateway(text, workdir, pooled) as gateway:
            await wait_ready(gateway)
            chaos = Chaos(gateway, upstream, redis, concurrency=12 if short else 32)
            chaos.redis_proxy = proxy
            n = 12 if short else 100
            try:
                for stream in (True, False):  # imports, caches, pools: in before the start
                    await chaos.requests(WARM_UP // 2 if short else WARM_UP, "healthy", stream)
                    await chaos.requests(20, "stall+fallback", stream)
                for name in WARM_UP_SCENARIOS:
                    await chaos.run(name, SCENARIOS[name], n)
                start = (gateway.rss_mib(), gateway.fds())
                print(HEADER, flush=True)
                for name, scenario in SCENARIOS.items():
                    if short and name in FULL_ONLY:
                        continue
                    line = await chaos.run(name, scenario, n)
                    out.append(line)
                    print(line, flush=True)
            finally:
                await chaos.close()
            return start
    finally:
        await upstream.stop()
        if proxy is not None:
            await proxy.stop()
        if redis is not None:
            redis.stop()


def within(value: float, start: float) -> bool:
    return value <= start * (1 + TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--short", action="store_true", help="fewer requests per scenario")
    args = parser.parse_args(argv)
    lines: list[Line] = []
    with tempfile.TemporaryDirectory(prefix="routegate-chaos-") as workdir:
        rss, fds = asyncio.run(run_suite(args.short, Path(workdir), lines))
    end = lines[-1]
    print(f"start {rss:.1f} MiB, {fds} fds; end {end.rss_after:.1f} MiB, {end.fds_after} fds")
    bad = [line.name for line in lines if line.lost or not within(line.rss_after, rss)
           or not within(line.fds_after, fds)]
    if bad:
        print("NOT CLEAN: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
