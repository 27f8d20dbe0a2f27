"""The queue inside the running gateway, against fake upstreams on loopback."""

import asyncio
import re
from typing import Any

import aiohttp
import pytest

from gateway.core.auth import key_hash
from gateway.queueing.http import QUEUES
from tests.conftest import RunningGateway, StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.waiting import until

# Declared speeds that make the prior hold time tiny (admit) or ~5 s (refuse at once).
FAST_PRIORS = {"network_ms": 1, "decode_tokens_per_s": 1_000_000}
SLOW_PRIORS = {"network_ms": 1, "decode_tokens_per_s": 50}


def backend(url: str, *, max_concurrency: int | None = 1, priors: dict[str, Any] | None = None,
            deployment: str = "dedicated", price: float = 0.0) -> dict[str, Any]:
    spec: dict[str, Any] = {"priors": priors or FAST_PRIORS,
                            "input_usd_per_mtok": price, "output_usd_per_mtok": price}
    entry: dict[str, Any] = {"type": "openai", "url": url, "deployment": deployment,
                             "models": {"m": spec}}
    if max_concurrency is not None:
        entry["max_concurrency"] = max_concurrency
    return entry


def policy(backends: dict[str, dict[str, Any]], *, ttft_ms: float | None = None,
           **extra: Any) -> dict[str, Any]:
    route: dict[str, Any] = {"targets": [f"{name}/m" for name in backends]}
    if ttft_ms is not None:
        route["latency_budget"] = {"ttft_ms": ttft_ms}
    return {"version": 1, "backends": backends, "routes": {"chat": route},
            "auth": {"anonymous": {"enabled": True, "loopback_only": True}}, **extra}


async def post(gateway: RunningGateway, content: str, *, key: str | None = None,
               timeout_s: float = 10.0, ttft_ms: float | None = None,
               ) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if ttft_ms is not None:
        headers["x-routegate-ttft-budget-ms"] = str(ttft_ms)
    body = {"model": "chat", "messages": [{"role": "user", "content": content}]}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s, \
            s.post(gateway.base_url + "/chat/completions", json=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.json()


def contents(fake: FakeOpenAI) -> list[str]:
    return [received.json["messages"][0]["content"] for received in fake.received]


def queue_ms(headers: dict[str, str]) -> float:
    match = re.search(r"queue;dur=([\d.]+)", headers["Server-Timing"])
    assert match, headers["Server-Timing"]
    return float(match.group(1))


async def test_request_beyond_max_concurrency_waits_and_reports_its_queue_time(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream(Behaviour(first_byte_delay_s=0.2))
    gateway = await start_gateway(policy({"local": backend(fake.url)}))
    first, second = await asyncio.gather(post(gateway, "a"), post(gateway, "b"))
    assert first[0] == second[0] == 200
    assert max(queue_ms(first[1]), queue_ms(second[1])) >= 150
    assert min(queue_ms(first[1]), queue_ms(second[1])) < 50


async def test_saturated_only_backend_sheds_with_503_and_retry_after(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream(Behaviour(first_byte_delay_s=0.5))
    gateway = await start_gateway(policy({"local": backend(fake.url, priors=SLOW_PRIORS)},
                                         ttft_ms=1000))
    holder = asyncio.create_task(post(gateway, "holder"))
    await fake.request_seen.wait()
    status, headers, body = await post(gateway, "shed")
    assert status == 503
    assert body["error"]["code"] == "backend_overloaded"
    assert int(headers["Retry-After"]) >= 1
    assert "local/m is saturated" in body["error"]["message"]
    assert (await holder)[0] == 200
    assert contents(fake) == ["holder"]


async def test_saturated_backend_spills_to_the_next_candidate(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.5), name="local")
    shared = await start_upstream(name="shared")
    gateway = await start_gateway(policy({
        "local": backend(local.url, priors=SLOW_PRIORS),
        "shared": backend(shared.url, max_concurrency=None, deployment="shared", price=1.0),
    }, ttft_ms=1000))
    holder = asyncio.create_task(post(gateway, "holder"))
    await local.request_seen.wait()
    status, _, _ = await post(gateway, "spilled")
    assert status == 200
    assert contents(shared) == ["spilled"]
    await holder
    assert contents(local) == ["holder"]


async def test_deadline_passing_in_the_queue_answers_504_saying_how_long_it_waited(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream(Behaviour(first_byte_delay_s=1.0))
    gateway = await start_gateway(policy({"local": backend(fake.url)}, ttft_ms=3000))
    holder = asyncio.create_task(post(gateway, "holder"))
    await fake.request_seen.wait()
    status, _, body = await post(gateway, "late", ttft_ms=300)
    assert status == 504
    assert body["error"]["code"] == "deadline_exceeded"
    assert re.search(r"waited 0\.[23]\d s in the queue", body["error"]["message"])
    await holder
    assert contents(fake) == ["holder"]


async def test_client_that_disconnects_while_queued_never_reaches_the_upstream(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream(Behaviour(first_byte_delay_s=1.5))
    gateway = await start_gateway(policy({"local": backend(fake.url)}))
    queues = gateway.app[QUEUES]
    holder = asyncio.create_task(post(gateway, "holder"))
    await fake.request_seen.wait()
    gone = asyncio.create_task(post(gateway, "gone", timeout_s=0.5))
    await until(lambda: queues.waiting("local") == 1, 0.5)
    with pytest.raises(TimeoutError):  # the client gives up and closes its connection
        await gone
    await until(lambda: queues.waiting("local") == 0, 0.5)  # the gateway notices
    assert not holder.done()  # the slot was still held: "gone" left from the queue
    await holder
    assert contents(fake) == ["holder"]
    assert queues.snapshot("local").counters.cancelled == 1
    assert queues.in_flight("local") == 0


async def test_high_priority_tenant_is_served_before_an_earlier_low_one(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream(Behaviour(first_byte_delay_s=0.2))
    gateway = await start_gateway(policy({"local": backend(fake.url)}, tenants={
        "batch": {"api_keys": [key_hash("k-low")], "priority": "low"},
        "interactive": {"api_keys": [key_hash("k-high")], "priority": "high"},
    }))
    holder = asyncio.create_task(post(gateway, "holder", key="k-low"))
    await fake.request_seen.wait()
    low = asyncio.create_task(post(gateway, "low", key="k-low"))
    await asyncio.sleep(0.05)
    high = asyncio.create_task(post(gateway, "high", key="k-high"))
    await asyncio.gather(holder, low, high)
    assert contents(fake) == ["holder", "high", "low"]


async def test_admin_can_read_every_queue(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream()
    gateway = await start_gateway(policy({"local": backend(fake.url, max_concurrency=4)}, auth={
        "anonymous": {"enabled": True, "loopback_only": True},
        "admin_keys": [key_hash("admin")],
    }))
    assert (await post(gateway, "one"))[0] == 200
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/admin/queues", headers={"Authorization": "Bearer admin"}) as r:
        assert r.status == 200
        queues = await r.json()
    assert queues["local"]["limit"] == 4
    assert queues["local"]["counters"]["admitted_at_once"] == 1
    assert set(queues["local"]["waiting_by_priority"]) == {"high", "normal", "low", "batch"}


async def test_queue_wait_is_a_histogram_per_backend_and_priority(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream()
    gateway = await start_gateway(policy({"local": backend(fake.url)}, tenants={
        "batch": {"api_keys": [key_hash("k-low")], "priority": "low"},
        "interactive": {"api_keys": [key_hash("k-high")], "priority": "high"},
    }))
    assert (await post(gateway, "a", key="k-low"))[0] == 200
    assert (await post(gateway, "b", key="k-high"))[0] == 200
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/metrics") as r:
        exposition = await r.text()
    for priority in ("low", "high"):
        assert (f'routegate_queue_wait_seconds_count{{backend="local",priority="{priority}"}} 1.0'
                in exposition)


async def test_a_model_with_its_own_limit_also_counts_against_its_backends_limit(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream(Behaviour(first_byte_delay_s=0.5))
    local = {"type": "openai", "url": fake.url, "deployment": "dedicated", "max_concurrency": 1,
             "models": {"big": {"priors": SLOW_PRIORS, "max_concurrency": 1},
                        "small": {"priors": SLOW_PRIORS}}}
    budget = {"latency_budget": {"ttft_ms": 1000}}
    gateway = await start_gateway({
        "version": 1, "backends": {"local": local},
        "routes": {"big": {"targets": ["local/big"], **budget},
                   "small": {"targets": ["local/small"], **budget}},
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}}})

    async def ask(model: str) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": model}]}
        async with aiohttp.ClientSession() as s, \
                s.post(gateway.base_url + "/chat/completions", json=body) as r:
            return r.status

    holder = asyncio.create_task(ask("big"))
    await fake.request_seen.wait()
    # The backend's one slot is taken by the big model's request: nothing else fits.
    assert await ask("small") == 503
    assert await holder == 200
    assert contents(fake) == ["big"]


async def test_the_queue_deadline_comes_from_the_route_that_serves_the_tenant(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream(Behaviour(first_byte_delay_s=0.5))
    config = policy({"local": backend(fake.url, priors=SLOW_PRIORS)}, tenants={
        "premium": {"api_keys": [key_hash("k-premium")], "routes": {"chat": "chat-fast"}}})
    config["routes"]["chat-fast"] = {"targets": ["local/m"], "latency_budget": {"ttft_ms": 1000}}
    gateway = await start_gateway(config)
    holder = asyncio.create_task(post(gateway, "holder"))
    await fake.request_seen.wait()
    # Asked for `chat`, served by `chat-fast`: its 1 s budget cannot survive the wait.
    status, _, body = await post(gateway, "premium", key="k-premium")
    assert status == 503 and body["error"]["code"] == "backend_overloaded"
    assert (await holder)[0] == 200
    assert contents(fake) == ["holder"]
