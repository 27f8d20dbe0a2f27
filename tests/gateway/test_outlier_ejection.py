"""Outlier ejection end to end: a failing upstream stops getting requests, then comes back."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai

from gateway.core.auth import key_hash
from tests.conftest import RunningGateway, StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour

ADMIN_KEY = "admin-key-for-tests"
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
BASE_EJECTION_S = 0.4


def policy(failing: str, healthy: str, **detection: Any) -> dict[str, Any]:
    def backend(url: str, price: float) -> dict[str, Any]:
        return {"type": "openai", "url": url, "models": {"m": {
            "input_usd_per_mtok": price, "output_usd_per_mtok": price}}}

    return {"version": 1,
            "backends": {"a": backend(failing, 0.0), "b": backend(healthy, 1.0)},
            "routes": {"chat": {"targets": ["a/m", "b/m"]}},
            "resilience": {"outlier_detection": {
                "consecutive_failures": 2, "base_ejection_s": BASE_EJECTION_S, **detection}},
            "auth": {"anonymous": {"enabled": True}, "admin_keys": [key_hash(ADMIN_KEY)]}}


async def get(gateway: RunningGateway, path: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + path, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        return await (response.json() if path != "/metrics" else response.text())


async def statuses(gateway: RunningGateway, count: int) -> list[int]:
    """`count` requests one after another, through the SDK."""
    client = gateway.openai()
    codes = []
    for _ in range(count):
        try:
            response = await client.chat.completions.with_raw_response.create(**BODY)
        except openai.APIStatusError as error:
            codes.append(error.status_code)
        else:
            codes.append(response.status_code)
    return codes


async def test_a_failing_target_is_ejected_after_failures_in_a_row_and_comes_back(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    failing = await start_upstream(Behaviour(status=503), name="failing")
    healthy = await start_upstream(name="healthy")
    gateway = await start_gateway(policy(failing.url, healthy.url))

    assert await statuses(gateway, 10) == [200] * 10  # the fallback answered every one
    assert len(failing.received) == 2  # then it got nothing more
    assert len(healthy.received) == 10

    ready = await get(gateway, "/readyz")
    assert ready["ejected"] == ["a/m"]
    target = (await get(gateway, "/admin/backends"))["backends"]["a"]["targets"]["a/m"]
    assert target["state"] == "ejected" and target["ejections_total"] == 1
    dashboard = await get(gateway, "/dashboard/data")
    assert dashboard["targets"]["a/m"]["state"] == "ejected"
    assert dashboard["targets"]["b/m"]["state"] == "in_service"
    metrics = await get(gateway, "/metrics")
    assert 'routegate_target_ejected{backend="a",model="m"} 1.0' in metrics
    assert 'routegate_outlier_ejections_total{backend="a",model="m"} 1.0' in metrics

    failing.behaviour = Behaviour()  # recovered
    await asyncio.sleep(BASE_EJECTION_S)
    assert await statuses(gateway, 3) == [200] * 3
    assert len(failing.received) == 5  # the probe, then back in service
    assert (await get(gateway, "/readyz"))["ejected"] == []
    assert 'routegate_target_ejected{backend="a",model="m"} 0.0' in await get(
        gateway, "/metrics")


async def test_a_failed_probe_ejects_the_target_again_for_longer(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    failing = await start_upstream(Behaviour(status=500), name="failing")
    healthy = await start_upstream(name="healthy")
    gateway = await start_gateway(policy(failing.url, healthy.url))

    await statuses(gateway, 2)
    await asyncio.sleep(BASE_EJECTION_S)
    assert await statuses(gateway, 3) == [200] * 3
    assert len(failing.received) == 3  # one probe, which failed

    target = (await get(gateway, "/admin/backends"))["backends"]["a"]["targets"]["a/m"]
    assert target["ejections_in_a_row"] == 2
    assert BASE_EJECTION_S < target["ejected_for_s"] <= 2 * BASE_EJECTION_S


async def test_a_target_that_answers_4xx_is_not_ejected(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    limited = await start_upstream(Behaviour(status=429), name="limited")
    healthy = await start_upstream(name="healthy")
    gateway = await start_gateway(policy(limited.url, healthy.url))

    assert await statuses(gateway, 5) == [200] * 5
    assert (await get(gateway, "/readyz"))["ejected"] == []
    target = (await get(gateway, "/admin/backends"))["backends"]["a"]["targets"]["a/m"]
    assert target["state"] == "in_service" and target["ejections_total"] == 0


async def test_the_only_target_of_a_route_is_never_ejected(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    failing = await start_upstream(Behaviour(status=503, fail_times=2), name="failing")
    healthy = await start_upstream(name="healthy")
    only = policy(failing.url, healthy.url)
    only["routes"]["chat"]["targets"] = ["a/m"]
    gateway = await start_gateway(only)

    assert await statuses(gateway, 3) == [502] * 2 + [200]
    assert len(failing.received) == 3


async def test_admin_backends_needs_an_admin_key(start_upstream: StartUpstream,
                                                 start_gateway: StartGateway) -> None:
    fake = await start_upstream()
    gateway = await start_gateway(policy(fake.url, fake.url))
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/admin/backends") as response:
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "missing_api_key"


async def test_failures_fewer_than_consecutive_failures_leave_the_target_in_routing(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    failing = await start_upstream(Behaviour(status=503), name="failing")
    healthy = await start_upstream(name="healthy")
    gateway = await start_gateway(policy(failing.url, healthy.url, consecutive_failures=5))

    assert await statuses(gateway, 10) == [200] * 10
    assert len(failing.received) == 5  # every failure up to the fifth, then ejected


async def test_a_burst_of_errors_on_every_target_ejects_no_more_than_the_cap(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstreams = [await start_upstream(Behaviour(status=500), name=f"failing-{i}")
                 for i in range(3)]
    three = policy(upstreams[0].url, upstreams[1].url, max_ejection_percent=34)
    three["backends"]["c"] = {**three["backends"]["b"], "url": upstreams[2].url}
    three["routes"]["chat"]["targets"] = ["a/m", "b/m", "c/m"]
    gateway = await start_gateway(three)

    assert set(await statuses(gateway, 12)) == {502}  # each one tried, none refused unsent
    before = sum(len(upstream.received) for upstream in upstreams)
    assert await statuses(gateway, 2) == [502] * 2
    # two of three still tried: 34 % of the route may be out, never more
    assert sum(len(upstream.received) for upstream in upstreams) > before


async def test_a_429_is_an_answer_for_every_view_of_health(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    limited = await start_upstream(Behaviour(status=429), name="limited")
    healthy = await start_upstream(name="healthy")
    gateway = await start_gateway(policy(limited.url, healthy.url))

    assert await statuses(gateway, 5) == [200] * 5
    assert len(limited.received) == 5  # never left out of routing
    target = (await get(gateway, "/admin/backends"))["backends"]["a"]["targets"]["a/m"]
    assert target["state"] == "in_service" and target["error_rate"] == 0.0
