"""`routegate serve --workers N`: real processes on one port under one supervisor."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.core.auth import key_hash
from gateway.launch.supervisor import free_port
from gateway.server.workers import WorkerSupervisor
from gateway.settings import Settings
from policies.load import load
from tests.conftest import single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver, start_http
from tests.procfs import children_of
from tests.waiting import until

CHILD = str(Path(__file__).parents[1] / "fakes" / "child_backend.py")
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
EXPORTER = "gateway.telemetry.tracing.export_process"


def command_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def worker_pids(supervisor_pid: int) -> set[int]:
    return {pid for pid in children_of(supervisor_pid) if "--worker-index" in command_of(pid)}


def descendants_of(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in children_of(todo.pop()):
            found.add(child)
            todo.append(child)
    return found


def exporter_pids(supervisor_pid: int) -> set[int]:
    return {pid for pid in descendants_of(supervisor_pid) if EXPORTER in command_of(pid)}


def running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def environment_of(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def accepted_by(workers: set[int], server_port: int, client_port: int) -> int | None:
    """The worker holding the server end of the TCP connection from `client_port`
    (Linux /proc); None while it is still in the kernel's accept queue."""
    inode = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
        if (local, remote) == (server_port, client_port):
            inode = int(fields[9])
    if not inode:
        return None
    for pid in workers:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


async def traced_request(port: int, workers: set[int]) -> tuple[int, str]:
    """One chat request on a new connection, with a trace id of its own: (the worker
    that served it, the trace id)."""
    trace_id = os.urandom(16).hex()
    body = json.dumps(CHAT).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        client_port = writer.get_extra_info("sockname")[1]
        worker = None
        for _ in range(100):
            if (worker := accepted_by(workers, port, client_port)) is not None:
                break
            await asyncio.sleep(0.02)
        assert worker is not None
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
                     b"Content-Type: application/json\r\nConnection: close\r\n"
                     b"traceparent: 00-%s-%s-01\r\nContent-Length: %d\r\n\r\n%s"
                     % (trace_id.encode(), os.urandom(8).hex().encode(), len(body), body))
        async with asyncio.timeout(10):
            assert (await reader.readline()).split()[1] == b"200"
            await reader.read()
    finally:
        writer.close()
    return worker, trace_id


async def traced_on_every_worker(port: int, workers: set[int]) -> dict[int, set[str]]:
    """Requests on new connections until each worker has served one; the trace ids
    each worker served."""
    served: dict[int, set[str]] = {}
    for _ in range(50):  # the kernel spreads connections among the workers by hash
        worker, trace_id = await traced_request(port, workers)
        served.setdefault(worker, set()).add(trace_id)
        if served.keys() == workers:
            break
    assert served.keys() == workers
    return served


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as session, asyncio.timeout(30):
        while True:
            try:
                async with session.get(url + "/readyz") as ready:
                    if ready.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)


async def post_each_on_its_own_connection(url: str, count: int,
                                          body: dict[str, Any] = CHAT) -> Counter[int]:
    """`count` chat requests at once, each on a new connection (the kernel spreads
    connections, not requests, among the workers); how many got each status."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> int:
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                await response.read()
                return response.status

        return Counter(await asyncio.gather(*(one() for _ in range(count))))


@pytest.fixture
async def serve_workers(tmp_path: Path) -> AsyncIterator[Any]:
    processes: list[asyncio.subprocess.Process] = []

    async def start(policy: dict[str, Any], workers: int = 2, env: dict[str, str] | None = None
                    ) -> tuple[asyncio.subprocess.Process, str, Path]:
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        port = free_port()
        env = {**{k: v for k, v in os.environ.items() if k != "ROUTEGATE_REDIS_URL"},
               **(env or {})}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--port",
            str(port), "--workers", str(workers), env=env, stdout=asyncio.subprocess.DEVNULL)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url)
        await until(lambda: len(worker_pids(process.pid)) == workers, 20.0)
        return process, url, path

    yield start
    for process in processes:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


@pytest.mark.slow
async def test_two_workers_admit_exactly_the_rate_limit_without_a_configured_redis(
        serve_workers, openai_upstream: FakeOpenAI) -> None:
    policy = single_backend_policy(openai_upstream.url, defaults={"limits": {
        "requests_per_minute": 100, "tokens_per_minute": 10_000_000}})
    process, url, _ = await serve_workers(policy)
    statuses = await post_each_on_its_own_connection(url, 300)
    assert statuses == {200: 100, 429: 200}
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 20) == 0


@pytest.mark.slow
async def test_a_worker_that_dies_is_started_again(serve_workers, openai_upstream) -> None:
    process, url, _ = await serve_workers(single_backend_policy(openai_upstream.url))
    before = worker_pids(process.pid)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    await until(lambda: len(worker_pids(process.pid) - {victim}) == 2, 20.0)
    assert victim not in worker_pids(process.pid)
    await wait_ready(url)
    assert await post_each_on_its_own_connection(url, 20) == {200: 20}


@pytest.mark.slow
async def test_a_policy_change_reaches_every_worker(serve_workers, openai_upstream) -> None:
    policy = single_backend_policy(openai_upstream.url)
    process, url, path = await serve_workers(policy)
    policy["routes"] = {"renamed": policy["routes"]["chat"]}
    path.write_text(yaml.safe_dump(policy))
    process.send_signal(signal.SIGHUP)  # as well as the file watch: either reaches all
    renamed = {**CHAT, "model": "renamed"}

    async def all_renamed() -> bool:
        return await post_each_on_its_own_connection(url, 30, renamed) == {200: 30}

    for _ in range(100):
        if await all_renamed():
            break
        await asyncio.sleep(0.1)
    assert await post_each_on_its_own_connection(url, 30, CHAT) == {404: 30}


@pytest.mark.slow
async def test_a_launched_backend_is_started_once_for_all_workers(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1,
        "backends": {"local": {"type": "openai", "launch": {"model": "demo"},
                               "models": {"demo": {}}}},
        "routes": {"chat": {"targets": ["local/demo"]}},
        "auth": {"anonymous": {"enabled": True}},
    }))
    settings = Settings(port=port, policy_path=path, launch_command=(sys.executable, CHILD))
    supervisor = WorkerSupervisor(
        load(path), settings, workers=2, directory=tmp_path,
        worker_command=[sys.executable, "-m", "gateway", "serve", "--policy", str(path),
                        "--port", str(port)])
    running = asyncio.create_task(supervisor.run())
    try:
        await wait_ready(f"http://127.0.0.1:{port}")
        await until(lambda: len(supervisor.workers) == 2, 20.0)
        await wait_ready(f"http://127.0.0.1:{port}")
        statuses = await post_each_on_its_own_connection(f"http://127.0.0.1:{port}", 20)
        assert statuses == {200: 20}
        launched = [pid for pid in children_of(os.getpid()) if CHILD in command_of(pid)]
        assert len(launched) == 1 and supervisor.backends.children["local"].starts == 1
    finally:
        supervisor.stop()
        assert await asyncio.wait_for(running, 20) == 0


async def test_launched_replicas_are_started_once_and_every_worker_picks_among_them(
        tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1,
        "backends": {"local": {"type": "openai", "deployment": "dedicated",
                               "launch": {"model": "demo", "replicas": 2},
                               "models": {"demo": {}}}},
        "routes": {"chat": {"targets": ["local/demo"]}},
        "auth": {"anonymous": {"enabled": True}, "admin_keys": [key_hash("admin")]},
    }))
    settings = Settings(port=port, policy_path=path, launch_command=(sys.executable, CHILD))
    supervisor = WorkerSupervisor(
        load(path), settings, workers=2, directory=tmp_path,
        worker_command=[sys.executable, "-m", "gateway", "serve", "--policy", str(path),
                        "--port", str(port)])
    running = asyncio.create_task(supervisor.run())
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url)
        await until(lambda: len(supervisor.workers) == 2, 20.0)
        await wait_ready(url)
        assert await post_each_on_its_own_connection(url, 20) == {200: 20}
        launched = [pid for pid in children_of(os.getpid()) if CHILD in command_of(pid)]
        assert len(launched) == 2
        assert set(supervisor.backends.children) == {"local#0", "local#1"}
        # each connection may land on either worker: every one of them sees both replicas
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def replicas_seen() -> int:
                async with session.get(url + "/admin/backends",
                                       headers={"Authorization": "Bearer admin"}) as response:
                    return len((await response.json())["backends"]["local"]["fleet"]["replicas"])

            assert set(await asyncio.gather(*(replicas_seen() for _ in range(16)))) == {2}
    finally:
        supervisor.stop()
        assert await asyncio.wait_for(running, 20) == 0


@pytest.fixture
async def otlp_receiver() -> AsyncIterator[tuple[OtlpReceiver, str]]:
    receiver = OtlpReceiver()
    runner, url = await start_http(receiver)
    yield receiver, url
    await runner.cleanup()


@pytest.mark.slow
async def test_two_workers_send_their_spans_through_one_exporter_process(
        serve_workers, openai_upstream: FakeOpenAI,
        otlp_receiver: tuple[OtlpReceiver, str]) -> None:
    receiver, otlp_url = otlp_receiver
    process, url, _ = await serve_workers(single_backend_policy(openai_upstream.url), env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url, "OTEL_BSP_SCHEDULE_DELAY": "100"})
    workers = worker_pids(process.pid)
    (exporter,) = exporter_pids(process.pid)
    assert exporter in children_of(process.pid)  # the supervisor's, not a worker's
    served = await traced_on_every_worker(int(url.rsplit(":", 1)[1]), workers)
    wanted = set().union(*served.values())
    await receiver.wait_for(lambda spans: wanted <= {span.trace_id for span in spans})
    assert exporter_pids(process.pid) == {exporter}
    for worker in workers:  # where they send: a socket in the supervisor's own directory
        address = environment_of(worker)["ROUTEGATE_TRACE_EXPORTER"]
        directory = Path(address.removeprefix("unix:")).parent
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.slow
async def test_at_shutdown_the_workers_flush_then_the_exporter_exports_and_exits(
        serve_workers, openai_upstream: FakeOpenAI,
        otlp_receiver: tuple[OtlpReceiver, str]) -> None:
    receiver, otlp_url = otlp_receiver
    policy = single_backend_policy(openai_upstream.url,
                                   server={"drain": {"announce_s": 0.0}})
    process, url, _ = await serve_workers(policy, env={  # nothing exported before the end
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url, "OTEL_BSP_SCHEDULE_DELAY": "600000"})
    (exporter,) = exporter_pids(process.pid)
    served = await traced_on_every_worker(int(url.rsplit(":", 1)[1]), worker_pids(process.pid))
    assert not receiver.spans
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0
    assert set().union(*served.values()) <= {span.trace_id for span in receiver.spans}
    assert not running(exporter)
