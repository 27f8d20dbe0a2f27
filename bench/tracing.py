"""What exporting every request's trace costs, measured side by side in one run.

Three `routegate serve` processes with the same policy in front of the same fast fake
upstream: one with no `OTEL_*` configuration (tracing off: the no-op provider), one
exporting every request's spans over OTLP/HTTP (`OTEL_EXPORTER_OTLP_ENDPOINT`, sampler
always on) and one sampling 10% of traces (`OTEL_TRACES_SAMPLER=traceidratio`), each
to its own local receiver that decodes and counts the spans. For each: throughput at
concurrency 16 and 64, CPU time per request of the gateway process, p50/p99 latency;
and the spans the receiver got (the batch processor drops rather than blocks when
its queue is full, so "spans received / expected" shows whether any were lost).

Reuses the load generator of `bench/loadgen.py` and the policy of `bench/overhead.py`; the gateways
are pinned to core 0, everything else runs on the other cores; rounds interleave.

    .venv/bin/python bench/tracing.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from loadgen import Result, cpu_seconds, free_port, load, pinned, wait_listening  # bench/
from overhead import ROOT, routegate_policy

SPANS_PER_REQUEST = 6  # root, auth, rate limit, route, queue, upstream


def run_sink(port: int) -> None:
    """An OTLP/HTTP trace receiver that decodes each export and counts the spans."""
    import uvloop
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    received = {"spans": 0}
    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    async def traces(request: web.Request) -> web.Response:
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received["spans"] += sum(len(ss.spans) for rs in message.resource_spans
                                 for ss in rs.scope_spans)
        return web.Response(body=reply, content_type="application/x-protobuf")

    async def count(request: web.Request) -> web.Response:
        return web.Response(text=str(received["spans"]))

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/count", count)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def measure(port: int, pid: int, counts: dict[int, int]) -> dict[str, Result]:
    await load(port, 16, 300)  # warm-up
    results = {}
    for c, n in counts.items():
        before = cpu_seconds(pid)
        results[f"c{c}"] = result = await load(port, c, n)
        result.cpu_us = (cpu_seconds(pid) - before) * 1e6 / len(result.latencies_ms)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("role", nargs="?", choices=["sink"])
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    if args.role == "sink":
        run_sink(args.port)
        return 0

    scale = 0.25 if args.quick else 1.0
    counts = {16: int(3000 * scale), 64: int(4000 * scale)}
    others = "1" if (os.cpu_count() or 1) == 2 else f"1-{(os.cpu_count() or 2) - 1}"
    python = sys.executable
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    base_env["PYTHONPATH"] = str(ROOT)
    processes: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], port: int, cores: str,
              extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(pinned(command, cores), env={**base_env, **(extra or {})},
                                   cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        processes.append(process)
        wait_listening(port, process)
        return process

    overhead = str(Path(__file__).with_name("overhead.py"))
    policy_path = Path(tempfile.mkstemp(suffix=".yaml")[1])
    rounds: list[dict[str, dict[str, Result]]] = []
    try:
        upstream_port, sink_port, sampled_sink_port = free_port(), free_port(), free_port()
        start([python, overhead, "upstream", "--port", str(upstream_port)], upstream_port,
              others)
        for port in (sink_port, sampled_sink_port):
            start([python, __file__, "sink", "--port", str(port)], port, others)
        policy_path.write_text(routegate_policy(f"http://127.0.0.1:{upstream_port}/v1"))
        serve = [python, "-m", "gateway", "serve", "--policy", str(policy_path), "--port"]
        off_port, on_port, sampled_port = free_port(), free_port(), free_port()
        off = start([*serve, str(off_port)], off_port, "0")
        on = start([*serve, str(on_port)], on_port, "0", {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
            "OTEL_TRACES_SAMPLER": "always_on"})
        sampled = start([*serve, str(sampled_port)], sampled_port, "0", {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sampled_sink_port}",
            "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"})
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {int(others.split("-")[0])})
        for _ in range(args.rounds):
            rounds.append({
                "tracing off": asyncio.run(measure(off_port, off.pid, counts)),
                "all traced": asyncio.run(measure(on_port, on.pid, counts)),
                "10% traced": asyncio.run(measure(sampled_port, sampled.pid, counts)),
            })
        spans = []
        for gateway, port in ((on, sink_port), (sampled, sampled_sink_port)):
            gateway.terminate()  # shutdown flushes the batch still queued
            gateway.wait(30)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=5) as r:
                spans.append(int(r.read()))
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(10)
        policy_path.unlink(missing_ok=True)
    # warm-up + measured requests that went through the traced gateway
    traced_requests = args.rounds * (300 + sum(
        (n // c) * c for c, n in counts.items()))
    report(rounds, spans, traced_requests * SPANS_PER_REQUEST)
    return 0


def report(rounds: list[dict[str, dict[str, Result]]], spans: list[int], expected: int) -> None:
    names = list(rounds[0])

    def med(name: str, key: str, what: str) -> float:
        values = []
        for r in rounds:
            result = r[name][key]
            values.append(result.rps if what == "rps" else result.cpu_us if what == "cpu"
                          else result.pct(float(what)))
        return statistics.median(values)

    print(f"\nmedian of {len(rounds)} interleaved rounds")
    print(f"{'':36}" + "".join(f"{n:>12}" for n in names)
          + "".join(f"{n.split()[0] + ' / off':>12}" for n in names[1:]))
    rows = [("throughput req/s, concurrency 16", "c16", "rps"),
            ("throughput req/s, concurrency 64", "c64", "rps"),
            ("CPU us per request, concurrency 16", "c16", "cpu"),
            ("CPU us per request, concurrency 64", "c64", "cpu"),
            ("latency p50 ms, concurrency 16", "c16", "0.5"),
            ("latency p99 ms, concurrency 16", "c16", "0.99")]
    for label, key, what in rows:
        values = [med(n, key, what) for n in names]
        fmt = "{:>12.0f}" if what in ("rps", "cpu") else "{:>12.3f}"
        print(f"{label:36}" + "".join(fmt.format(v) for v in values)
              + "".join(f"{v / values[0]:>12.3f}" for v in values[1:]))
    print(f"spans received, all traced: {spans[0]} of {expected} "
          f"({100 * spans[0] / max(expected, 1):.1f}%); 10% traced: {spans[1]} "
          f"({100 * spans[1] / max(expected, 1):.1f}%)")

if __name__ == "__main__":
    sys.exit(main())
