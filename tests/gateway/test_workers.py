"""`routegate serve --workers N`: real processes on one port under one supervisor."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.launch.supervisor import free_port
from gateway.server.workers import WorkerSupervisor
from gateway.settings import Settings
from policies.load import load
from tests.conftest import single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI

CHILD = str(Path(__file__).parents[1] / "fakes" / "child_backend.py")
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def children_of(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(child) for child in (task / "children").read_text().split())
    return found


def command_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def worker_pids(supervisor_pid: int) -> set[int]:
    return {pid for pid in children_of(supervisor_pid) if "--worker-index" in command_of(pid)}


async def until(condition: Callable[[], bool], within_s: float = 20.0) -> None:
    for _ in range(int(within_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the condition did not hold in time")


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

    async def start(policy: dict[str, Any], workers: int = 2
                    ) -> tuple[asyncio.subprocess.Process, str, Path]:
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "ROUTEGATE_REDIS_URL"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--port",
            str(port), "--workers", str(workers), env=env, stdout=asyncio.subprocess.DEVNULL)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url)
        await until(lambda: len(worker_pids(process.pid)) == workers)
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
    await until(lambda: len(worker_pids(process.pid) - {victim}) == 2)
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
        await until(lambda: len(supervisor.workers) == 2)
        await wait_ready(f"http://127.0.0.1:{port}")
        statuses = await post_each_on_its_own_connection(f"http://127.0.0.1:{port}", 20)
        assert statuses == {200: 20}
        launched = [pid for pid in children_of(os.getpid()) if CHILD in command_of(pid)]
        assert len(launched) == 1 and supervisor.backends.children["local"].starts == 1
    finally:
        supervisor.stop()
        assert await asyncio.wait_for(running, 20) == 0
