"""The chaos suite: the real gateway (`routegate serve`, its own process) in front of
misbehaving backends (`upstream.py`), misbehaving clients (`clients.py`), a Redis that
is killed and restarted under load, and broken policies hot-loaded. One line per
scenario: requests sent, ok, clear errors, lost, and the gateway's RSS and open file
descriptors before and after it. The goal, and the test's assertion: lost = 0 on every
line, RSS and fds back within 10 % of where they started.

    python -m tests.chaos            # the full suite (`make chaos`)
    python -m tests.chaos --short    # the short form `make test` runs
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.chaos import clients
from tests.chaos.upstream import FRAMING_FAULTS, ChaosUpstream
from tests.delay_proxy import DelayProxy
from tests.ports import free_port
from tests.procfs import children_of
from tests.redis_server import RedisServer

FAULTS = ("healthy", "reset_before_headers", "reset_after_headers", "reset_mid_stream",
          "stall", "slow_first_byte", "eof_mid_stream", "json_for_stream",
          "malformed_events", "oversized", "endless", "slow_stream", "big_stream",
          "status_429", "status_429_retry_after", "status_500", "status_503",
          "status_503_retry_after", "status_529", *FRAMING_FAULTS)
TOLERANCE = 0.10  # RSS and fds back within 10 % of the start
SETTLE_S = 5.0  # how long the gateway may take to close what a scenario left open


def policy(upstream_port: int, redis_url: str | None,
           launch_local: bool = False) -> dict[str, object]:
    """One backend per fault; per fault a route to it alone and one with a fallback;
    with `launch_local`, the local backend (demo model) launched by the gateway."""
    backends: dict[str, object] = {
        fault: {"type": "openai", "url": f"http://127.0.0.1:{upstream_port}/{fault}/v1",
                "max_connections": 64, "models": {"m": {}},
                "timeouts": {"connect_s": 1.0, "first_byte_s": 0.5, "total_s": 2.0,
                             "pool_wait_s": 0.5}}
        for fault in FAULTS}
    # the healthy backend costs a little more, so a `+fallback` route tries its fault first
    backends["healthy"]["models"] = {  # type: ignore[index]
        "m": {"input_usd_per_mtok": 0.01, "output_usd_per_mtok": 0.01}}
    routes: dict[str, object] = {}
    for fault in FAULTS:
        routes[fault] = {"targets": [f"{fault}/m"]}
        if fault != "healthy":
            routes[f"{fault}+fallback"] = {"targets": [f"{fault}/m", "healthy/m"]}
    if launch_local:
        backends["local"] = {"type": "openai", "models": {"demo": {}},
                             "launch": {"model": "demo", "startup_timeout_s": 300}}
        routes["local"] = {"targets": ["local/demo"]}
        routes["local+fallback"] = {"targets": ["local/demo", "healthy/m"]}
    return {
        "version": 1, "backends": backends, "routes": routes,
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}},
        "defaults": {"limits": {"requests_per_minute": 10_000_000,
                                "tokens_per_minute": 10_000_000_000}},
        "limits": {"store": redis_url or "memory", "on_store_error": "fail_open"},
        "server": {"max_upstream_body_bytes": 1 << 20, "max_event_bytes": 64 << 10,
                   "header_read_timeout_s": 1.0, "body_read_timeout_s": 1.0,
                   "max_connections_per_client": 400},
    }


@dataclass
class Gateway:
    """`routegate serve` as its own process: its port, pid and what it holds."""

    process: subprocess.Popen[bytes]
    port: int
    policy_path: Path
    # peers whose kept-alive connections are pools bounded by the policy (backends,
    # Redis): not counted as what a scenario left open
    pooled_ports: frozenset[int] = frozenset()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def children(self) -> list[int]:
        """The pids of the processes the gateway launched (local backends)."""
        return sorted(children_of(self.process.pid))

    def fds(self) -> int:
        """Open file descriptors, less connections to `pooled_ports`."""
        pid = self.process.pid
        pooled = set()
        for table in ("tcp", "tcp6"):
            for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = row.split()
                if int(fields[2].rsplit(":", 1)[1], 16) in self.pooled_ports:
                    pooled.add(f"socket:[{fields[9]}]")
        count = 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/{pid}/fd/{fd}") not in pooled
        return count


@contextlib.contextmanager
def running_gateway(policy_text: str, workdir: Path,
                    pooled_ports: frozenset[int] = frozenset()) -> Iterator[Gateway]:
    path = workdir / "policy.yaml"
    path.write_text(policy_text)
    port = free_port()
    log = (workdir / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield Gateway(process, port, path, pooled_ports)
    except BaseException:
        print((workdir / "gateway.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def wait_ready(gateway: Gateway, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if gateway.process.poll() is not None:
                raise RuntimeError("the gateway exited during start-up")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{gateway.port}/healthz") as reply:
                    if reply.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError("the gateway did not start in time")


@dataclass
class Line:
    name: str
    outcomes: Counter[str] = field(default_factory=Counter)
    rss_before: float = 0.0
    rss_after: float = 0.0
    fds_before: int = 0
    fds_after: int = 0
    seconds: float = 0.0

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())

    @property
    def lost(self) -> int:
        return sum(n for outcome, n in self.outcomes.items() if outcome.startswith("lost"))

    def __str__(self) -> str:
        losses = ", ".join(f"{o[6:]} ×{n}" for o, n in self.outcomes.items()
                           if o.startswith("lost"))
        return (f"{self.name:<30} {self.sent:>5} {self.outcomes[clients.OK]:>5} "
                f"{self.outcomes[clients.CLEAR]:>6} {self.lost:>5}   "
                f"{self.rss_before:6.1f} → {self.rss_after:6.1f} MiB   "
                f"{self.fds_before:>4} → {self.fds_after:<4} {self.seconds:5.1f} s"
                + (f"  ({losses})" if losses else ""))


HEADER = (f"{'scenario':<30} {'sent':>5} {'ok':>5} {'clear':>6} {'lost':>5}   "
          f"{'RSS before → after':>20}   {'fds':>11} {'time':>7}")
Scenario = Callable[["Chaos", int], Awaitable[list[str]]]


class Chaos:
    """Runs scenarios against one gateway; `n` requests each (fewer in the short form)."""

    def __init__(self, gateway: Gateway, upstream: ChaosUpstream,
                 redis: RedisServer | None, concurrency: int) -> None:
        self.gateway = gateway
        self.upstream = upstream
        self.redis = redis
        self.redis_proxy: DelayProxy | None = None  # Redis as the gateway reaches it
        self.concurrency = concurrency
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency))

    async def many(self, n: int, one: Callable[[], Awaitable[str]]) -> list[str]:
        gate = asyncio.Semaphore(self.concurrency)

        async def bounded() -> str:
            async with gate:
                return await one()
        return list(await asyncio.gather(*(bounded() for _ in range(n))))

    async def requests(self, n: int, model: str, stream: bool,
                       read_pause_s: float = 0.0) -> list[str]:
        return await self.many(n, lambda: clients.request(
            self.session, self.gateway.url, model, stream, read_pause_s=read_pause_s))

    async def settle(self, baseline_fds: int) -> None:
        """Wait (a little) for connections a scenario left to be closed."""
        for _ in range(int(SETTLE_S / 0.1)):  # /proc has nothing to wait on: poll it
            if self.gateway.fds() <= baseline_fds * (1 + TOLERANCE):
                return
            await asyncio.sleep(0.1)

    async def run(self, name: str, scenario: Scenario, n: int) -> Line:
        line = Line(name, rss_before=self.gateway.rss_mib(), fds_before=self.gateway.fds())
        started = time.monotonic()
        line.outcomes.update(await scenario(self, n))
        line.seconds = time.monotonic() - started
        await self.session.close()  # its kept-alive connections are not the gateway's
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.concurrency))
        await self.settle(line.fds_before)
        line.rss_after, line.fds_after = self.gateway.rss_mib(), self.gateway.fds()
        return line

    async def close(self) -> None:
        await self.session.close()
