"""Batch state shared through a real Redis by two `routegate serve` processes: either
answers for a batch, one runs it, and when that one is killed (SIGKILL, no goodbye) the
other takes the lease over and finishes the batch. The dedicated backend is a real
local_backend: the lines the dead replica had in flight there are sent again under the
same `Idempotency-Key`, and the engine runs every line exactly once; none is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.batches.redis_state import RedisState
from tests.conftest import StartUpstream
from tests.gateway.batches.conftest import batch_policy, file_lines, jsonl, submit
from tests.gateway.route.local_replicas import StartReplicas, start_replicas
from tests.ports import free_port
from tests.redis_server import RedisServer

__all__ = ["start_replicas"]  # the fixture, used by name below

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
LINES = 60


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    started: list[asyncio.subprocess.Process] = []
    yield started
    for process in started:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def start_replica(policy_path: Path, log: Path) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTEGATE_", "OTEL_"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--policy", str(policy_path), "--port",
        str(port), cwd=ROOT, env=env, stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="anonymous", max_retries=0)
    async with asyncio.timeout(30):
        while True:
            if process.returncode is not None:
                raise RuntimeError(await asyncio.to_thread(log.read_text))
            try:
                await client.models.list()
                return process, url
            except openai.APIConnectionError:
                await asyncio.sleep(0.1)


def demo_lines(count: int) -> list[dict[str, Any]]:
    return [{"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "chat", "max_tokens": 4,
                      "messages": [{"role": "user", "content": f"hello {n}"}]}}
            for n in range(count)]


async def engine_metric(base_url: str, name: str, **labels: str) -> float:
    """A sum over the local_backend's /metrics samples of `name` with `labels`."""
    async with aiohttp.ClientSession() as session, session.get(
            base_url.removesuffix("/v1") + "/metrics") as response:
        text = await response.text()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == name
               and all(sample.labels.get(k) == v for k, v in labels.items()))


async def test_a_replica_killed_mid_batch_is_taken_over_and_the_engine_runs_each_line_once(
        start_upstream: StartUpstream, start_replicas: StartReplicas, redis_server: RedisServer,
        tmp_path: Path, replicas: list[asyncio.subprocess.Process]) -> None:
    [engine] = await start_replicas(1)  # local_backend, the demo model
    cloud = await start_upstream(name="cloud")
    policy = batch_policy(engine.url, cloud.url, tmp_path / "shared-volume",
                          store=redis_server.url, lease_s=1.0)
    policy["backends"]["local"]["models"] = {"demo": {}}
    policy["routes"]["chat"]["targets"] = ["local/demo", "cloud/gpt-4o-mini"]
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    first, first_url = await start_replica(path, tmp_path / "first.log")
    replicas.append(first)
    second, second_url = await start_replica(path, tmp_path / "second.log")
    replicas.append(second)
    to_first = openai.AsyncOpenAI(base_url=first_url + "/v1", api_key="anonymous")
    to_second = openai.AsyncOpenAI(base_url=second_url + "/v1", api_key="anonymous")
    admitted = "routegate:request_queue_time_seconds_by_band_count"  # runs the engine began
    warm_up_runs = await engine_metric(engine.url, admitted)
    created = await submit(to_first, jsonl(demo_lines(LINES)))
    state = RedisState(redis_server.url)
    try:
        async with asyncio.timeout(20):  # a third of the lines done, by whichever runs it
            while True:  # polled: the results live in another process's Redis writes
                if len(await state.results(created.id)) >= LINES // 3:
                    break
                await asyncio.sleep(0.02)
        holder = await state.holder(created.id)
        assert holder is not None
        runner, other = (first, second) if f":{first.pid}:" in holder else (second, first)
        runner.send_signal(signal.SIGKILL)
        await runner.wait()
        survivor = to_second if runner is first else to_first

        holders = set()
        async with asyncio.timeout(30):
            while (batch := await survivor.batches.retrieve(created.id)).status != "completed":
                holders.add(await state.holder(created.id))
                await asyncio.sleep(0.05)
    finally:
        await state.aclose()

    assert any(f":{other.pid}:" in (h or "") for h in holders)  # the survivor took it over
    assert batch.request_counts is not None and batch.request_counts.completed == LINES
    out = await file_lines(survivor, batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"line-{n}" for n in range(LINES))
    assert all(line["response"]["status_code"] == 200 for line in out)
    assert not cloud.received  # every line ran on the dedicated backend
    # each line began in the engine exactly once, whoever sent it and how often
    assert await engine_metric(engine.url, admitted) - warm_up_runs == LINES
    assert await engine_metric(engine.url, "routegate:idempotent_requests_total",
                               outcome="run") == LINES
    # the lines the dead replica had in flight were sent again, and answered without a run
    resent = sum([await engine_metric(engine.url, "routegate:idempotent_requests_total",
                                      outcome=outcome) for outcome in ("attached", "replayed")])
    assert 1 <= resent <= 8  # `lines_in_flight`
