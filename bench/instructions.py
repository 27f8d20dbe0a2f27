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

`--tree LABEL=DIR` adds routegate served from another checkout's source (DIR: a copy of
the repository with one change undone, say) under the same interpreter and packages,
so a change is counted against the code without it in one run; a LABEL ending in
" traced" serves it traced, as "routegate traced" is. `--rounds N` measures
every process N times, interleaved, and prints each round: a difference is past noise
when the ranges of the rounds do not overlap.

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
from pathlib import Path

from loadgen import free_port, load, pinned, wait_listening  # bench/ is this script's folder
from overhead import VARIANTS, routegate_policy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WARM_UP_REQUESTS = 400
CONCURRENCY = 16


TRACED = "routegate traced"  # every request traced, exported by the exporter process


def _command(name: str, port: int, upstream: str, policy: Path,
             trees: dict[str, Path]) -> list[str]:
    python, script = sys.executable, str(HERE / "overhead.py")
    if name == "bare proxy":
        return [python, script, "bare-proxy", "--port", str(port), "--upstream", upstream]
    if name in ("routegate", TRACED, *trees):
        return [python, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port)]
    return [python, script, "gateway-variant", "--variant", name, "--port", str(port),
            "--policy", str(policy)]


def _total_instructions(out_dir: Path) -> int:
    """The `totals:` (or `summary:`) line of the largest dump: the measured part."""
    best = 0
    for dump in out_dir.glob("callgrind.out*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith(("totals:", "summary:")):
                best = max(best, int(line.split()[1]))
    return best


def count(name: str, upstream: str, policy: Path, requests: int, env: dict[str, str],
          trees: dict[str, Path]) -> int:
    """Instructions per request of one proxy process (a tree's: run from its folder, which
    `python -m` puts first on the path)."""
    port = free_port()
    tree = trees.get(name)
    if tree is not None:
        env = {**env, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as out:
        out_dir = Path(out)
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={out_dir / 'callgrind.out'}",
                   *_command(name, port, upstream, policy, trees)]
        process = subprocess.Popen(pinned(command, "0"), env=env, cwd=tree or ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(port, process, timeout_s=180)
            asyncio.run(load(port, CONCURRENCY, WARM_UP_REQUESTS, authorized=name != "bare proxy"))
            subprocess.run(["callgrind_control", "--instr=on", str(process.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            result = asyncio.run(load(port, CONCURRENCY, requests,
                                      authorized=name != "bare proxy"))
            subprocess.run(["callgrind_control", "--dump", str(process.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            measured = len(result.latencies_ms)
            deadline = time.monotonic() + 30
            while not _total_instructions(out_dir) and time.monotonic() < deadline:
                time.sleep(0.2)
            return _total_instructions(out_dir) // measured
        finally:
            process.terminate()
            process.wait(60)


def _traced_env(env: dict[str, str], cores: str,
                sink: list[subprocess.Popen[bytes]]) -> dict[str, str]:
    """`env` exporting every request's spans to an OTLP/HTTP receiver on `cores` (the
    gateway's exporter process is not run under valgrind: only the gateway's share is
    counted, as `bench/tracing.py` counts "gateway CPU")."""
    port = free_port()
    sink.append(subprocess.Popen(
        pinned([sys.executable, str(HERE / "tracing.py"), "sink", "--port", str(port)], cores),
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_listening(port, sink[-1])
    return {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_TRACES_SAMPLER": "always_on"}


def _trees(specs: list[str]) -> dict[str, Path]:
    trees = {}
    for spec in specs:
        label, _, folder = spec.partition("=")
        if not label or not (Path(folder) / "gateway" / "__main__.py").is_file():
            raise SystemExit(f"--tree {spec!r}: want LABEL=DIR, DIR a copy of the repository")
        trees[label] = Path(folder).resolve()
    return trees


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="also routegate from this copy of the repository")
    parser.add_argument("--only", nargs="+", help="measure only these (and the bare proxy)")
    args = parser.parse_args(argv)
    trees = _trees(args.tree)
    names = ["bare proxy", "routegate", *VARIANTS, TRACED, *trees]
    if args.only and set(args.only) - set(names):
        parser.error(f"--only: choose from {names}")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    chosen = [name for name in names if name in (args.only or names)]
    if "bare proxy" not in chosen:
        chosen = ["bare proxy", *chosen]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    upstream_port = free_port()
    others = "1" if (os.cpu_count() or 1) == 2 else f"1-{(os.cpu_count() or 2) - 1}"
    sink: list[subprocess.Popen[bytes]] = []  # the OTLP receiver of the traced variant
    upstream_process = subprocess.Popen(
        pinned([sys.executable, str(HERE / "overhead.py"), "upstream", "--port",
                str(upstream_port)], others), env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    policy = Path(tempfile.mkstemp(suffix=".yaml")[1])
    rounds: list[dict[str, int]] = []
    try:
        wait_listening(upstream_port, upstream_process)
        upstream = f"http://127.0.0.1:{upstream_port}/v1"
        policy.write_text(routegate_policy(upstream))
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {int(others.split("-")[0])})  # the load generator
        traced = {name for name in chosen if name == TRACED or name.endswith(" traced")}
        traced_env = _traced_env(env, others, sink) if traced else env
        for _ in range(args.rounds):
            rounds.append({name: count(name, upstream, policy, args.requests,
                                       traced_env if name in traced else env, trees)
                           for name in chosen})
    finally:
        for process in [upstream_process, *sink]:
            process.terminate()
            process.wait(10)
        policy.unlink(missing_ok=True)
    report(rounds, args.requests)
    return 0


def report(rounds: list[dict[str, int]], requests: int) -> None:
    print(f"\ninstructions per request, {requests} requests at concurrency {CONCURRENCY}, "
          f"{len(rounds)} round(s)")
    print(f"{'':20}{'instructions (each round)':>40}{'bare / this':>14}{'vs routegate':>22}")
    for name in rounds[0]:
        each = [one[name] for one in rounds]
        ratio = sorted(one["bare proxy"] / one[name] for one in rounds)
        line = (f"{name:20}{', '.join(f'{n:,}' for n in each):>40}"
                f"{_span(ratio, '{:.2f}'):>14}")
        if "routegate" in rounds[0] and name != "routegate":
            change = sorted(100 * (one[name] / one["routegate"] - 1) for one in rounds)
            line += f"{_span(change, '{:+.1f} %'):>22}"
        print(line)


def _span(values: list[float], form: str) -> str:
    low, high = form.format(values[0]), form.format(values[-1])
    return low if low == high else f"{low} – {high}"


if __name__ == "__main__":
    sys.exit(main())
