"""Priority in the engine under overload: high-band TTFT, low-band completion, throughput.

    .venv/bin/python bench/engine_priority.py [--threads 2] [--duration-s 10] [--load 2.0]

The demo model's engine, in process (no HTTP), is first measured at capacity (closed
loop, a full batch), then driven open loop at `--load` times that request rate for
`--duration-s` with Poisson arrivals, 20 % of them band 0 (high) and 80 % band 2 (low),
and drained. The same arrival schedule runs against the engine with
`scheduling_policy="priority"` and with `"fcfs"` (arrival order, the engine before
priorities), in the same process one after the other. Unloaded: high-band requests
sent one at a time to the idle engine. High band alone: the schedule's high-band
arrivals with the low-band ones left out, on the priority engine: what the high band's
own load costs on this engine before any low-band work is added. Printed: high-band
TTFT p95 against unloaded and against FCFS, whether every low-band request completed
(and its worst wait), and total output tokens/s (all work over the time from first
arrival to last token) against FCFS.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from local_backend.demo import ensure_demo_model  # noqa: E402
from local_backend.engine.loop import Engine, EngineConfig  # noqa: E402
from local_backend.engine.params import SamplingParams  # noqa: E402
from local_backend.model.loader import load_model  # noqa: E402
from local_backend.tokenizer import Tokenizer  # noqa: E402

HIGH, LOW = 0, 2
HIGH_SHARE = 0.2
PROMPT_TOKENS = 64
NEW_TOKENS = 32
PARAMS = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@dataclass
class Result:
    band: int
    arrival: float
    first_token: float | None = None
    finished: float | None = None
    tokens: int = 0
    preemptions: int = 0


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)

    def ttft_ms(self, band: int) -> list[float]:
        return [(r.first_token - r.arrival) * 1000 for r in self.results
                if r.band == band and r.first_token is not None]

    def completed(self, band: int) -> tuple[int, int]:
        mine = [r for r in self.results if r.band == band]
        return sum(r.tokens == NEW_TOKENS for r in mine), len(mine)

    def tokens_per_s(self) -> float:
        start = min(r.arrival for r in self.results)
        end = max(r.finished or start for r in self.results)
        return sum(r.tokens for r in self.results) / (end - start)


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(0, 256) for _ in range(PROMPT_TOKENS)]


async def one(engine: Engine, name: str, ids: list[int], band: int, result: Result) -> None:
    outputs = engine.add_request(name, ids, PARAMS, arrival=result.arrival, priority=band)
    while True:
        out = await outputs.get()
        if out.token_ids and result.first_token is None:
            result.first_token = out.time
        result.tokens += len(out.token_ids)
        if out.finished:
            result.finished, result.preemptions = out.time, out.preemptions
            return


async def capacity_rps(engine: Engine, seconds: float, concurrency: int) -> float:
    """Requests per second with the batch kept full (closed loop)."""
    rng = random.Random(1)
    done = 0
    stop = time.monotonic() + seconds

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while time.monotonic() < stop:
            await one(engine, f"cap{w}-{i}", prompt(rng), LOW, Result(LOW, engine.clock()))
            done += 1
            i += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return done / (time.monotonic() - started)


async def unloaded_ttft_ms(engine: Engine, count: int) -> list[float]:
    rng = random.Random(2)
    run = Run()
    for i in range(count):
        result = Result(HIGH, engine.clock())
        run.results.append(result)
        await one(engine, f"alone{i}", prompt(rng), HIGH, result)
    return run.ttft_ms(HIGH)


async def open_loop(engine: Engine, rate: float, duration_s: float, seed: int,
                    only: int | None = None) -> Run:
    """Poisson arrivals at `rate` for `duration_s`, then drained; `only`: that band's
    requests of the same schedule, the others left out."""
    rng = random.Random(seed)
    schedule: list[tuple[float, int, list[int]]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            break
        schedule.append((t, HIGH if rng.random() < HIGH_SHARE else LOW, prompt(rng)))
    run = Run()
    tasks = []
    start = time.monotonic()
    for i, (at, band, ids) in enumerate(schedule):
        if only is not None and band != only:
            continue
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        result = Result(band, engine.clock())
        run.results.append(result)
        tasks.append(asyncio.create_task(one(engine, f"r{i}", ids, band, result)))
    await asyncio.gather(*tasks)
    return run


def make_engine(model_dir: Path, policy: str, args: argparse.Namespace) -> Engine:
    model = load_model(model_dir, progress=None)
    config = EngineConfig(max_num_seqs=args.max_num_seqs, max_waiting=100_000,
                          num_blocks=args.num_blocks, max_num_batched_tokens=256,
                          scheduling_policy=policy)  # type: ignore[arg-type]
    engine = Engine(model, Tokenizer.from_dir(model_dir), config)
    engine.start()
    return engine


async def main_async(args: argparse.Namespace) -> None:
    cache = Path(os.environ.get("ROUTEGATE_CACHE_DIR") or tempfile.gettempdir()) / "routegate"
    model_dir = ensure_demo_model(cache)
    runs: dict[str, Run] = {}
    priority = make_engine(model_dir, "priority", args)
    try:
        await capacity_rps(priority, 1.0, args.max_num_seqs)  # warm-up
        capacity = await capacity_rps(priority, args.capacity_s, args.max_num_seqs)
        alone = await unloaded_ttft_ms(priority, args.unloaded)
        rate = capacity * args.load
        print(f"capacity {capacity:.2f} req/s ({capacity * NEW_TOKENS:.0f} tok/s); "
              f"offered {rate:.2f} req/s for {args.duration_s:.0f} s", flush=True)
        runs["priority"] = await open_loop(priority, rate, args.duration_s, seed=3)
        preemptions = priority.stats().preemptions
        # What the high band's own load costs: its arrivals of the same schedule, alone.
        high_alone = await open_loop(priority, rate, args.duration_s, seed=3, only=HIGH)
    finally:
        priority.stop()
    fcfs = make_engine(model_dir, "fcfs", args)
    try:
        await capacity_rps(fcfs, 1.0, args.max_num_seqs)  # the same warm-up
        runs["fcfs"] = await open_loop(fcfs, rate, args.duration_s, seed=3)
    finally:
        fcfs.stop()

    print(f"\nunloaded high TTFT p50 {statistics.median(alone):.1f} ms, p95 {p95(alone):.1f} ms "
          f"({len(alone)} requests); machine load {os.getloadavg()[0]:.1f}")
    print("| engine   | high TTFT p50 ms | high TTFT p95 ms | low TTFT p95 ms | "
          "low completed | low worst wait s | output tok/s |")
    print("|----------|-----:|-----:|-----:|-----:|-----:|-----:|")
    for name, run in runs.items():
        high, low = run.ttft_ms(HIGH), run.ttft_ms(LOW)
        done, total = run.completed(LOW)
        print(f"| {name:8s} | {statistics.median(high):.1f} | {p95(high):.1f} | "
              f"{p95(low):.1f} | {done}/{total} | {max(low) / 1000:.1f} | "
              f"{run.tokens_per_s():.1f} |")
    prio, base = runs["priority"], runs["fcfs"]
    high_p95 = p95(prio.ttft_ms(HIGH))
    own = high_alone.ttft_ms(HIGH)
    print(f"\nhigh band alone (its arrivals of the same schedule, no low-band work): "
          f"TTFT p50 {statistics.median(own):.1f} ms, p95 {p95(own):.1f} ms = "
          f"{p95(own) / p95(alone):.2f}x unloaded: the high band's own queueing")
    print(f"\nhigh TTFT p95: {high_p95 / p95(alone):.2f}x unloaded (target <= 1.5), "
          f"{high_p95 / p95(base.ttft_ms(HIGH)):.3f}x FCFS (target <= 0.25)")
    print(f"output tok/s: {prio.tokens_per_s() / base.tokens_per_s():.3f}x FCFS "
          f"(target >= 0.95); preemptions under priority: {preemptions}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--load", type=float, default=2.0, help="offered load × capacity")
    parser.add_argument("--capacity-s", type=float, default=4.0)
    parser.add_argument("--unloaded", type=int, default=20)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--num-blocks", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
