"""What a response-cache hit costs, measured side by side in one run on loopback.

A fast fake upstream and `routegate serve` with a cached route (`cache:` with
`store_content`), and for each of:

  direct        the fake upstream's JSON answer, no gateway
  hit           the gateway answering from its in-memory cache (no backend call)
  stream hit    the same, streamed (the kept answer replayed as SSE)
  miss          the gateway proxying the request and keeping the answer
                (`Cache-Control: no-cache`: looked past, answered afresh, kept again)

latency p50 / p99 at concurrency 1, and the gateway's CPU time per request (the
upstream's for direct), robust to other load on the machine. The hit's added latency
is hit − direct; the CPU ratio is hit / miss. Processes are pinned as in
`bench/overhead.py`; rounds interleave and the median is printed.

    .venv/bin/python bench/cache.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from loadgen import Result, cpu_seconds, free_port, load, pinned, wait_listening
from overhead import routegate_policy

ROOT = Path(__file__).resolve().parent.parent
DETERMINISTIC = b',"temperature":0'
KINDS = {"direct": (b"", b""), "hit": (DETERMINISTIC, b""),
         "stream hit": (DETERMINISTIC, b""),
         "miss": (DETERMINISTIC, b"Cache-Control: no-cache\r\n")}


def cached_policy(upstream: str) -> str:
    return routegate_policy(upstream).replace(
        "chat: {targets: [fast/m]}",
        "chat: {targets: [fast/m], cache: {ttl_s: 3600, store_content: true}}")


async def measure(kind: str, port: int, pid: int, count: int) -> Result:
    fields, headers = KINDS[kind]
    stream = kind == "stream hit"
    options = {"authorized": kind != "direct", "extra_fields": fields,
               "extra_headers": headers, "stream": stream}
    await load(port, 1, 50, **options)  # warm-up; the first request fills the cache
    before = cpu_seconds(pid)
    result = await load(port, 1, count, **options)
    result.cpu_us = (cpu_seconds(pid) - before) * 1e6 / len(result.latencies_ms)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    args = parser.parse_args(argv)
    count = 200 if args.quick else 1000
    others = "1" if (os.cpu_count() or 1) == 2 else f"1-{(os.cpu_count() or 2) - 1}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], port: int, cores: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(pinned(command, cores), env=env, cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.append(process)
        wait_listening(port, process)
        return process

    policy_path = Path(tempfile.mkstemp(suffix=".yaml")[1])
    rounds: list[dict[str, Result]] = []
    try:
        upstream_port = free_port()
        upstream = start([sys.executable, str(ROOT / "bench" / "overhead.py"), "upstream",
                          "--port", str(upstream_port)], upstream_port, others)
        policy_path.write_text(cached_policy(f"http://127.0.0.1:{upstream_port}/v1"))
        port = free_port()
        gateway = start([sys.executable, "-m", "gateway", "serve", "--policy",
                         str(policy_path), "--port", str(port)], port, "0")
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {int(others.split("-")[0])})
        for _ in range(args.rounds):
            one = {"direct": asyncio.run(measure("direct", upstream_port, upstream.pid,
                                                 count))}
            for kind in ("hit", "stream hit", "miss"):
                one[kind] = asyncio.run(measure(kind, port, gateway.pid, count))
            rounds.append(one)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(10)
        policy_path.unlink(missing_ok=True)
    report(rounds)
    return 0


def report(rounds: list[dict[str, Result]]) -> None:
    def median(kind: str, value: str) -> float:
        picks = {"p50": lambda r: r.pct(0.5), "p99": lambda r: r.pct(0.99),
                 "cpu": lambda r: r.cpu_us}
        return statistics.median(picks[value](r[kind]) for r in rounds)

    print(f"{'concurrency 1':<14}{'p50 ms':>9}{'p99 ms':>9}{'CPU us/req':>12}")
    for kind in KINDS:
        print(f"{kind:<14}{median(kind, 'p50'):>9.3f}{median(kind, 'p99'):>9.3f}"
              f"{median(kind, 'cpu'):>12.0f}")
    print(f"hit adds {median('hit', 'p50') - median('direct', 'p50'):.3f} ms (p50) over a "
          f"direct answer; a miss adds {median('miss', 'p50') - median('direct', 'p50'):.3f} ms")
    print(f"CPU per request: hit / miss = {median('hit', 'cpu') / median('miss', 'cpu'):.2f}, "
          f"stream hit / miss = {median('stream hit', 'cpu') / median('miss', 'cpu'):.2f}")


if __name__ == "__main__":
    sys.exit(main())
