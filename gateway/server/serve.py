"""`routegate serve`: load the policy, build the app, listen until SIGTERM, then drain."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

from aiohttp import web

from gateway.app import LIVE_POLICY, create_app
from gateway.compat import IncompatibleAiohttp, check_aiohttp
from gateway.core.drain import CUT_GRACE_S, DRAIN, drain_and_stop
from gateway.server.runner import GatewayRunner
from gateway.server.workers import supervise, worker_count
from gateway.settings import Settings, default_data_dir, default_policy_path, package_version
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import TracingConfigError
from policies.load import PolicyError, load

log = logging.getLogger("routegate.serve")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the gateway",
        description="Run the gateway: the OpenAI API under /v1, Anthropic's /v1/messages, "
                    "/healthz, /readyz, /metrics, /dashboard and /admin/*.",
        epilog="Environment: ROUTEGATE_POLICY (the policy when --policy is not given), "
               "ROUTEGATE_REDIS_URL (the rate-limit store, over limits.store), "
               "ROUTEGATE_CACHE_DIR (the demo model's cache), OTEL_* (trace export). "
               "SIGHUP reloads the policy file; SIGINT or SIGTERM stop the gateway.")
    parser.add_argument("--policy", type=Path, default=None, metavar="FILE",
                        help="policy file (default: $ROUTEGATE_POLICY, else the bundled "
                             "policies/default.yaml)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every "
                             "interface)")
    parser.add_argument("--port", type=int, default=8080,
                        help="port to listen on (default 8080)")
    parser.add_argument("--shadow-policy", type=Path, default=None, metavar="FILE",
                        help="decide every request under this candidate policy too, without "
                             "affecting it; differences at /admin/policy/shadow")
    parser.add_argument("--workers", type=worker_count, default=1, metavar="N|auto",
                        help="gateway processes sharing the port under one supervisor "
                             "(default 1; auto: one per CPU)")
    # set by the supervisor of `--workers N` for each worker it starts
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--launch-board", type=Path, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_aiohttp()
    except IncompatibleAiohttp as exc:
        log.error("%s", exc)
        return 2
    path = args.policy or Path(os.environ.get("ROUTEGATE_POLICY") or default_policy_path())
    try:
        policy = load(path)
    except PolicyError as exc:
        log.error("%s", exc)
        return 2
    for warning in policy.warnings:
        log.warning("%s", warning)
    if args.shadow_policy is not None:
        try:
            load(args.shadow_policy)
        except PolicyError as exc:
            log.error("shadow policy: %s", exc)
            return 2
    settings = Settings(host=args.host, port=args.port, policy_path=path,
                        shadow_policy_path=args.shadow_policy, workers=args.worker_count,
                        reuse_port=args.worker_index is not None,
                        launch_board=args.launch_board,
                        data_dir=default_data_dir(os.environ))
    if args.workers > 1 and args.worker_index is None:
        worker_args = ["--policy", str(path), "--host", args.host, "--port", str(args.port)]
        if args.shadow_policy is not None:
            worker_args += ["--shadow-policy", str(args.shadow_policy)]
        return supervise(policy, settings, workers=args.workers, serve_args=worker_args)
    try:  # OTEL_* (trace export; none configured = none)
        # one bare JSON line per request on stdout, buffered (flushed about once a second)
        # its own 64 KiB buffer on stdout's descriptor: `sys.stdout.buffer` writes every
        # line at once under PYTHONUNBUFFERED (one system call per request)
        access_stream = open(sys.stdout.fileno(), "wb", buffering=1 << 16,  # noqa: SIM115
                             closefd=False)
        telemetry = Telemetry.from_env(os.environ, access_stream=access_stream)
    except TracingConfigError as exc:
        log.error("%s", exc)
        return 2
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve(create_app(policy, settings, telemetry=telemetry), settings))


# Young-generation threshold: a request allocates a few hundred tracked objects, so the
# default (700) ran a collection every couple of requests.
GC_THRESHOLDS = (20_000, 20, 20)


def settle_garbage_collector() -> None:
    """Once the app is built (policy, BPE tables, modules: ~10⁶ long-lived objects), move
    everything alive to the permanent generation and collect the young one less often.
    Full collections otherwise walked all of it every few seconds under load: p99 at
    concurrency 64 went from ~110 to ~45 ms (bench/overhead.py's load, one core)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(app: web.Application, settings: Settings) -> int:
    # handler_cancellation: a client that disconnects cancels its handler at once, which
    # closes the upstream connection so the backend stops generating for nobody.
    # shutdown_timeout: the drain has already waited for requests (gateway/core/drain.py).
    runner = GatewayRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=CUT_GRACE_S)
    await runner.setup()
    settle_garbage_collector()
    stop, hurry = asyncio.Event(), asyncio.Event()
    interactive = False

    def on_signal(signum: signal.Signals) -> None:
        nonlocal interactive
        if stop.is_set():
            log.warning("second %s: stopping now", signum.name)
            hurry.set()
            return
        interactive = signum == signal.SIGINT
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        site = web.TCPSite(runner, settings.host, settings.port, backlog=1024,
                           reuse_port=settings.reuse_port or None)
        try:
            await site.start()
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", settings.host, settings.port, exc.strerror)
            return 1
        log.info("%s", startup_banner(settings))
        await stop.wait()
        drain = app[LIVE_POLICY].current.file.server.drain
        # Ctrl-C at a terminal: no load balancer to tell, so no announce period
        await drain_and_stop(runner, app[DRAIN], hurry=hurry, timeout_s=drain.timeout_s,
                             announce_s=0.0 if interactive else drain.announce_s)
    finally:
        if runner.server is not None:  # not cleaned up by the drain (start-up failed)
            await runner.cleanup()
    return 0


def startup_banner(settings: Settings) -> str:
    """What an operator needs once the gateway listens: where the API, the dashboard
    and the metrics are, and which policy runs."""
    # a wildcard address is not one to browse to: show this machine's loopback instead
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(
        settings.host, f"[{settings.host}]" if ":" in settings.host else settings.host)
    base = f"http://{host}:{settings.port}"
    return (f"routegate {package_version()} listening on {settings.host}:{settings.port} "
            f"(policy {settings.policy_path})\n"
            f"  API base URL  {base}/v1\n"
            f"  dashboard     {base}/dashboard\n"
            f"  metrics       {base}/metrics\n"
            f"  readiness     {base}/readyz")
