"""What exporting every request's trace costs, measured side by side in one run.

Three `routegate serve` processes with the same policy in front of the same fast fake
upstream: one with no `OTEL_*` configuration (tracing off); one exporting every
request's spans over OTLP/HTTP (`OTEL_EXPORTER_OTLP_ENDPOINT`, sampler always on, from
its exporter process); and one sampling 10% of traces (`OTEL_TRACES_SAMPLER=traceidratio`),
each to its own local receiver that counts the spans. For each: throughput at
concurrency 16 and 64 and at a fixed rate (`--rate`, 1,200 req/s), CPU time per
request of the gateway process and of the gateway with its exporter process, p50/p99
latency; and the spans the receiver got
(spans are dropped rather than waited for when the export falls behind, so "spans
received / expected" shows whether any were lost).

Reuses the load generator of `bench/loadgen.py` and the policy of `bench/overhead.py`.
Each gateway process (all its threads) is pinned to core 0 once it is up; its exporter
process runs on the other cores, as it would on any multi-core host, with everything
else; rounds interleave. Ratios to tracing off are the median of each round's ratio,
with the lowest and highest.

    .venv/bin/python bench/tracing.py [--quick] [--rounds N]   # 12 rounds by default
    .venv/bin/python bench/tracing.py request-path   # in-process µs per traced request
"""

from __future__ import annotations

import argparse
import asyncio
import marshal
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadgen import (  # bench/
    Result,
    cpu_seconds,
    free_port,
    load,
    paced,
    pinned,
    process_tree,
    tree_cpu_seconds,
    wait_listening,
)
from overhead import ROOT, routegate_policy

SPANS_PER_REQUEST = 6  # root, auth, rate limit, route, queue, upstream
WARM_UP = 160  # requests before each measured load (a multiple of 16)
PACED_RATE = 1200.0  # req/s: below every configuration's capacity on one core
# A traced gateway's last partial batch leaves within this (not the default 5 s), inside
# the pause after its own load, instead of during another configuration's measurement.
SCHEDULE_DELAY_MS = 200


def run_sink(port: int) -> None:
    """An OTLP/HTTP trace receiver that keeps each export and, asked for the count,
    decodes them all and counts the spans (decoding as they arrive would take CPU from
    the load generator's core while a gateway is measured)."""
    import uvloop
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    bodies: list[bytes] = []
    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    async def traces(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.Response(body=reply, content_type="application/x-protobuf")

    async def count(request: web.Request) -> web.Response:
        spans = 0
        for body in bodies:
            message = trace_service_pb2.ExportTraceServiceRequest()
            message.ParseFromString(body)
            spans += sum(len(ss.spans) for rs in message.resource_spans
                         for ss in rs.scope_spans)
        return web.Response(text=str(spans))

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/count", count)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def pin_threads(pid: int, core: int) -> None:
    """Every thread of `pid` onto `core`; processes it has started keep their own mask."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), {core})


async def measure(port: int, pid: int, counts: dict[int, int],
                  rate: float) -> dict[str, Measured]:
    await load(port, 16, WARM_UP)
    await asyncio.sleep(0.3)  # its spans handed off, so their export is not counted below
    results = {}
    for c, n in [*counts.items(), (0, counts[16])]:
        before, before_all = cpu_seconds(pid), tree_cpu_seconds(pid)
        result = await (load(port, c, n) if c else paced(port, rate, n))
        await asyncio.sleep(0.3)  # this load's spans handed off to the exporter process
        done = len(result.latencies_ms)
        results[f"c{c}" if c else "paced"] = Measured(
            result, (cpu_seconds(pid) - before) * 1e6 / done,
            (tree_cpu_seconds(pid) - before_all) * 1e6 / done)
    return results


@dataclass
class Measured:
    load: Result
    cpu_us: float  # the gateway process, per request
    total_cpu_us: float  # the gateway and its exporter process, per request


async def request_path(requests: int = 2000, repeats: int = 12) -> None:
    """Thread CPU µs a traced request adds on the request path, in-process, on the
    pipeline's own telemetry calls (`scripted_request`), best of `repeats`; and the
    work the hand-off thread and the exporter process do per request."""
    sys.path.insert(0, str(ROOT))
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from gateway.telemetry.service import Telemetry
    from gateway.telemetry.tracing import Tracing
    from gateway.telemetry.tracing.export_process import Exporter
    from gateway.telemetry.tracing.otlp_post import ExportConfig
    from gateway.telemetry.tracing.pipe import MARSHAL_VERSION, SpanPipe
    from gateway.telemetry.tracing.setup import resource_from_env, sampler_from_env
    from gateway.telemetry.tracing.trace_context import Sampling
    from tests.gateway.telemetry.scripted_request import scripted_request

    class Null(SpanExporter):
        """An exporter that sends nothing."""

        def export(self, spans: Sequence[object]) -> SpanExportResult:  # type: ignore[override]
            return SpanExportResult.SUCCESS

    resource = resource_from_env({}, "routegate")
    pipe = SpanPipe(ExportConfig(endpoint="http://127.0.0.1:9/v1/traces"),
                    resource=dict(resource.attributes), handoff_s=3600.0,
                    handoff_records=1 << 30,  # kept here: measured below, not sent
                    schedule_delay_s=3600.0,
                    max_queue_spans=1 << 30, max_batch_spans=1 << 30)
    sampling = Sampling(sampler_from_env({}))
    setups = {"off": Telemetry(),
              "records (exporter process)": Telemetry(tracing=Tracing(sampling, pipe)),
              "SDK batch processor": Telemetry(tracing=Tracing.to_processors(
                  [BatchSpanProcessor(Null())], resource=resource))}
    best = dict.fromkeys(setups, float("inf"))
    for _ in range(repeats):
        for name, telemetry in setups.items():
            started = time.thread_time()
            for _ in range(requests):
                await scripted_request(telemetry)
            best[name] = min(best[name], (time.thread_time() - started) * 1e6 / requests)
            pipe._queue.clear()
    for name, us in best.items():
        extra = f"  (+{us - best['off']:.1f} traced)" if name != "off" else ""
        print(f"request path, {name:32} {us:7.1f} us{extra}")
    for _ in range(requests):
        await scripted_request(setups["records (exporter process)"])
    payload = marshal.dumps([data for _, data in pipe._queue], MARSHAL_VERSION)  # a frame
    pipe._queue.clear()  # nothing left for the provider to flush at exit
    best_export = float("inf")
    for _ in range(repeats):
        exporter = Exporter({"export": {"endpoint": "http://127.0.0.1:9/v1/traces"},
                             "resource": dict(resource.attributes), "max_batch_spans": 2048,
                             "schedule_delay_s": 3600.0}, post=lambda data: True)
        started = time.thread_time()
        exporter.add(payload)
        exporter.export()
        best_export = min(best_export, (time.thread_time() - started) * 1e6 / requests)
    print(f"exporter process, load + encode: {best_export:.1f} us a request "
          f"({len(payload) / requests:.0f} bytes marshalled)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--rate", type=float, default=PACED_RATE)
    parser.add_argument("role", nargs="?", choices=["sink", "request-path"])
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    if args.role == "sink":
        run_sink(args.port)
        return 0
    if args.role == "request-path":
        asyncio.run(request_path())
        return 0

    scale = 0.25 if args.quick else 1.0
    counts = {16: int(1024 * scale), 64: int(1280 * scale)}  # short rounds, many of them
    others = "1" if (os.cpu_count() or 1) == 2 else f"1-{(os.cpu_count() or 2) - 1}"
    python = sys.executable
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    base_env["PYTHONPATH"] = str(ROOT)
    processes: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], port: int, cores: str | None,
              extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(pinned(command, cores) if cores else command,
                                   env={**base_env, **(extra or {})},
                                   cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        processes.append(process)
        wait_listening(port, process)
        return process

    overhead = str(Path(__file__).with_name("overhead.py"))
    policy_path = Path(tempfile.mkstemp(suffix=".yaml")[1])
    rounds: list[dict[str, dict[str, Measured]]] = []
    try:
        upstream_port = free_port()
        sink_ports = [free_port() for _ in range(2)]
        start([python, overhead, "upstream", "--port", str(upstream_port)], upstream_port,
              others)
        for port in sink_ports:
            start([python, __file__, "sink", "--port", str(port)], port, others)
        policy_path.write_text(routegate_policy(f"http://127.0.0.1:{upstream_port}/v1"))
        serve = [python, "-m", "gateway", "serve", "--policy", str(policy_path), "--port"]
        traced = {
            "all, process": {"OTEL_TRACES_SAMPLER": "always_on"},
            "10%, process": {"OTEL_TRACES_SAMPLER": "traceidratio",
                             "OTEL_TRACES_SAMPLER_ARG": "0.1"},
        }
        off_port = free_port()
        gateways = {"off": (start([*serve, str(off_port)], off_port, None), off_port)}
        for (name, extra), sink_port in zip(traced.items(), sink_ports, strict=True):
            port = free_port()
            gateways[name] = (start([*serve, str(port)], port, None, {
                **extra, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
                "OTEL_BSP_SCHEDULE_DELAY": str(SCHEDULE_DELAY_MS)}), port)
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {int(others.split("-")[0])})
        for process, port in gateways.values():
            asyncio.run(load(port, 16, WARM_UP))  # starts the exporter process
            pin_threads(process.pid, 0)
            for child in process_tree(process.pid)[1:]:  # its exporter: another core, as on
                pin_threads(child, int(others.split("-")[0]))  # any multi-core host
        for _ in range(args.rounds):
            rounds.append({name: asyncio.run(measure(port, process.pid, counts, args.rate))
                           for name, (process, port) in gateways.items()})
        spans = []
        for (gateway, _), port in zip(list(gateways.values())[1:], sink_ports, strict=True):
            gateway.terminate()  # shutdown flushes the batch still queued
            gateway.wait(30)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=60) as r:
                spans.append(int(r.read()))
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(10)
        policy_path.unlink(missing_ok=True)
    # start-up, warm-up and measured requests that went through each traced gateway
    traced_requests = WARM_UP + args.rounds * (WARM_UP + counts[16] + sum(
        (n // c) * c for c, n in counts.items()))
    report(rounds, spans, traced_requests * SPANS_PER_REQUEST)
    return 0


def report(rounds: list[dict[str, dict[str, Measured]]], spans: list[int],
           expected: int) -> None:
    names = list(rounds[0])

    def med(name: str, key: str, what: str) -> float:
        values = []
        for r in rounds:
            m = r[name][key]
            values.append(m.load.rps if what == "rps" else m.cpu_us if what == "cpu"
                          else m.total_cpu_us if what == "total" else m.load.pct(float(what)))
        return statistics.median(values)

    print(f"\nmedian of {len(rounds)} interleaved rounds")
    print(f"{'':40}" + "".join(f"{n:>17}" for n in names))
    rows = [("throughput req/s, concurrency 16", "c16", "rps"),
            ("throughput req/s, concurrency 64", "c64", "rps"),
            ("gateway CPU us/request, concurrency 16", "c16", "cpu"),
            ("gateway CPU us/request, concurrency 64", "c64", "cpu"),
            ("+ exporter process, concurrency 16", "c16", "total"),
            ("+ exporter process, concurrency 64", "c64", "total"),
            ("gateway CPU us/request, paced", "paced", "cpu"),
            ("+ exporter process, paced", "paced", "total"),
            ("throughput req/s, paced", "paced", "rps"),
            ("latency p50 ms, concurrency 16", "c16", "0.5"),
            ("latency p99 ms, concurrency 16", "c16", "0.99")]
    def ratios(name: str, key: str, what: str) -> str:
        per_round = sorted(
            (m.load.rps / off.load.rps if what == "rps" else m.cpu_us / off.cpu_us
             if what == "cpu" else m.total_cpu_us / off.total_cpu_us)
            for m, off in ((r[name][key], r[names[0]][key]) for r in rounds))
        return (f"{statistics.median(per_round):.2f} "
                f"({per_round[0]:.2f}-{per_round[-1]:.2f})")

    for label, key, what in rows:
        values = [med(n, key, what) for n in names]
        fmt = "{:>17.0f}" if what in ("rps", "cpu", "total") else "{:>17.3f}"
        print(f"{label:40}" + "".join(fmt.format(v) for v in values))
        if what in ("rps", "cpu", "total"):
            print(f"{'  / tracing off':40}{'':17}"
                  + "".join(f"{ratios(n, key, what):>17}" for n in names[1:]))
    for name, got in zip(names[1:], spans, strict=True):
        print(f"spans received, {name}: {got} of {expected} "
              f"({100 * got / max(expected, 1):.1f}%)")


if __name__ == "__main__":
    sys.exit(main())
