"""Two `routegate serve` processes sharing one Redis enforce one global limit.

300 concurrent requests spread over both replicas, against a limit of 100 per
minute, yield exactly 100 accepted — for requests per minute and for tokens per
minute. (Gateways that count per replica, or check and then increment in two
round trips, accept more; this is the test that they would fail.)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from routing.tokens import TokenCounter
from tests.fakes.openai_upstream import FakeOpenAI
from tests.ports import free_port
from tests.redis_server import RedisServer, find_redis_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
RPM_KEY, TPM_KEY = "rpm-tenant-key", "tpm-tenant-key"
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
RESERVED = TokenCounter().count_request(BODY) + BODY["max_tokens"]  # what one admission holds
LIMIT = 100


def key_hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


class UpstreamThread:
    """The fake OpenAI server on its own event loop, shared by the replicas."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fake: FakeOpenAI = self._run(self._make())
        self.url = self._run(self.fake.start())

    async def _make(self) -> FakeOpenAI:
        return FakeOpenAI()

    def _run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def stop(self) -> None:
        self._run(self.fake.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@dataclass
class Replicas:
    urls: list[str]
    upstream: UpstreamThread


def start_replica(policy_path: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ROUTEGATE_", "OTEL_"))}
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--policy", str(policy_path),
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"gateway not ready:\n{log_path.read_text()}")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("no redis-server binary")
    directory = tmp_path_factory.mktemp("replicas")
    redis = RedisServer(binary, directory)
    redis.start()
    upstream = UpstreamThread()
    policy = {
        "version": 1,
        "backends": {"up": {"type": "openai", "url": upstream.url,
                            "models": {"gpt-4o-mini": {}}}},
        "routes": {"chat": {"targets": ["up/gpt-4o-mini"]}},
        "tenants": {
            "by_requests": {"api_keys": [key_hash(RPM_KEY)], "limits": {
                "requests_per_minute": LIMIT, "tokens_per_minute": 10**9}},
            "by_tokens": {"api_keys": [key_hash(TPM_KEY)], "limits": {
                "requests_per_minute": 10**6, "tokens_per_minute": LIMIT * RESERVED}},
        },
        # fail_closed: a Redis hiccup shows up as 503s, never as extra admissions
        "limits": {"store": redis.url, "on_store_error": "fail_closed", "replicas": 2},
    }
    policy_path = directory / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    processes, urls = [], []
    try:
        for n in range(2):
            port = free_port()
            log_path = directory / f"gateway-{n}.log"
            processes.append((start_replica(policy_path, port, log_path), log_path))
            urls.append(f"http://127.0.0.1:{port}")
        for url, (process, log_path) in zip(urls, processes, strict=True):
            wait_ready(url, process, log_path)
        yield Replicas(urls, upstream)
    finally:
        for process, _ in processes:
            process.terminate()
        for process, _ in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        upstream.stop()
        redis.stop()


async def burst(urls: list[str], key: str, count: int) -> Counter[int]:
    """`count` requests at once, alternating between the replicas; statuses counted."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def one(n: int) -> int:
            url = urls[n % len(urls)] + "/v1/chat/completions"
            async with session.post(url, json=BODY,
                                    headers={"Authorization": f"Bearer {key}"}) as response:
                await response.read()
                return response.status

        statuses = await asyncio.gather(*(one(n) for n in range(count)))
    return Counter(statuses)


def test_300_concurrent_requests_over_two_replicas_admit_exactly_100_per_minute(
        replicas: Replicas) -> None:
    replicas.upstream.fake.behaviour.first_byte_delay_s = 0.0
    statuses = asyncio.run(burst(replicas.urls, RPM_KEY, 3 * LIMIT))
    assert statuses == Counter({200: LIMIT, 429: 2 * LIMIT})


def test_300_concurrent_requests_over_two_replicas_admit_exactly_100_by_tokens(
        replicas: Replicas) -> None:
    # Settling refunds the unused reservation; hold the answers back until every
    # admission has been decided, so the count measures admission alone.
    replicas.upstream.fake.behaviour.first_byte_delay_s = 2.0
    statuses = asyncio.run(burst(replicas.urls, TPM_KEY, 3 * LIMIT))
    assert statuses == Counter({200: LIMIT, 429: 2 * LIMIT})
