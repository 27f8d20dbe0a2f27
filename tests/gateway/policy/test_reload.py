"""Hot reload on a running gateway: API, file watch and SIGHUP; atomic under traffic."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.policy.admin import RELOADER
from gateway.settings import Settings
from policies import hash_key
from tests.conftest import RunningGateway, StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.waiting import until

ADMIN_KEY = "rg-admin-test"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def write(path: Path, text: str) -> None:
    path.write_text(text)  # a few hundred bytes to a local disk: not worth a thread


def read(path: Path) -> str:
    return path.read_text()


def version_text(url: str, version: str) -> str:
    """A policy whose `chat` route sends `model: <version>` upstream to `url`."""
    policy = single_backend_policy(url, backend=f"b{version}",
                                   auth={"anonymous": {"enabled": True, "loopback_only": True},
                                         "admin_keys": [hash_key(ADMIN_KEY)]},
                                   defaults={"limits": {"requests_per_minute": 1_000_000,
                                                        "tokens_per_minute": 100_000_000}})
    policy["backends"][f"b{version}"]["models"] = {"m": {"upstream_name": version}}
    policy["routes"]["chat"]["targets"] = [f"b{version}/m"]
    return yaml.safe_dump(policy, sort_keys=False)


async def start(start_gateway: StartGateway, path: Path, *, watch: bool = False
                ) -> RunningGateway:
    return await start_gateway(read(path), Settings(
        port=0, policy_path=path, watch_policy=watch, supervise=False))


async def admin(session: aiohttp.ClientSession, gateway: RunningGateway, method: str,
                path: str) -> tuple[int, dict]:
    async with session.request(method, gateway.url + path, headers=ADMIN) as response:
        return response.status, await response.json()


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    return tmp_path / "policy.yaml"


async def test_reload_api_swaps_in_a_changed_file(
        start_upstream: StartUpstream, start_gateway: StartGateway, policy_path: Path) -> None:
    one, two = await start_upstream(name="one"), await start_upstream(name="two")
    write(policy_path, version_text(one.url, "v1"))
    gateway = await start(start_gateway, policy_path)
    write(policy_path, version_text(two.url, "v2"))
    async with aiohttp.ClientSession() as session:
        status, body = await admin(session, gateway, "POST", "/admin/policy/reload")
        assert (status, body["result"], body["changed"]) == (200, "ok", True)
        async with session.post(gateway.base_url + "/chat/completions", json=CHAT) as response:
            assert response.status == 200
    assert [r.json["model"] for r in two.received] == ["v2"]
    assert one.received == []


async def test_invalid_file_leaves_the_running_policy_and_is_shown(
        start_upstream: StartUpstream, start_gateway: StartGateway, policy_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    one = await start_upstream()
    write(policy_path, version_text(one.url, "v1"))
    gateway = await start(start_gateway, policy_path)
    running = gateway.app[RELOADER].live.current
    write(policy_path, version_text(one.url, "v1").replace("targets:", "targetz:"))
    async with aiohttp.ClientSession() as session:
        with caplog.at_level(logging.ERROR, logger="routegate.policy"):
            for _ in range(3):
                status, body = await admin(session, gateway, "POST", "/admin/policy/reload")
                assert status == 422 and body["error"]["code"] == "invalid_policy"
        assert "routes.chat.targetz" in [error["field"] for error in body["reload"]["errors"]]
        _, shown = await admin(session, gateway, "GET", "/admin/policy")
        async with session.post(gateway.base_url + "/chat/completions", json=CHAT) as response:
            assert response.status == 200
    assert gateway.app[RELOADER].live.current is running
    assert shown["version_hash"] == running.version_hash
    assert shown["last_error"]["issues"][0]["line"] is not None
    assert f"{policy_path}:" in shown["last_error"]["message"]
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == 1


async def test_a_changed_limits_store_is_reported_as_needing_a_restart(
        start_upstream: StartUpstream, start_gateway: StartGateway, policy_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    one, two = await start_upstream(name="one"), await start_upstream(name="two")
    write(policy_path, version_text(one.url, "v1"))
    gateway = await start(start_gateway, policy_path)
    moved = yaml.safe_load(version_text(two.url, "v2"))
    moved["limits"] = {"store": "redis://127.0.0.1:1/0"}  # never dialled: the store stays
    write(policy_path, yaml.safe_dump(moved, sort_keys=False))
    async with aiohttp.ClientSession() as session:
        with caplog.at_level(logging.WARNING, logger="routegate.policy"):
            status, body = await admin(session, gateway, "POST", "/admin/policy/reload")
        _, shown = await admin(session, gateway, "GET", "/admin/policy")
        async with session.post(gateway.base_url + "/chat/completions", json=CHAT) as response:
            assert response.status == 200  # the rest of the file is in force
            assert "x-ratelimit-remaining-requests" in response.headers  # memory store
    assert (status, body["result"], body["changed"]) == (200, "ok", True)
    assert body["restart_needed"] == ["limits.store"]
    assert shown["restart_needed"] == ["limits.store"]
    assert [r.json["model"] for r in two.received] == ["v2"]
    assert any("limits.store" in r.getMessage() and "restart" in r.getMessage()
               for r in caplog.records)
    write(policy_path, version_text(two.url, "v2"))  # back to the store that runs
    async with aiohttp.ClientSession() as session:
        _, body = await admin(session, gateway, "POST", "/admin/policy/reload")
        _, shown = await admin(session, gateway, "GET", "/admin/policy")
    assert body["restart_needed"] == shown["restart_needed"] == []


async def test_reloads_are_counted_by_result(
        start_upstream: StartUpstream, start_gateway: StartGateway, policy_path: Path) -> None:
    one = await start_upstream()
    write(policy_path, version_text(one.url, "v1"))
    gateway = await start(start_gateway, policy_path)
    reloader = gateway.app[RELOADER]
    await reloader.reload("test")
    write(policy_path, "version: 1\n")
    await reloader.reload("test")
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/metrics",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        exposition = await response.text()
    assert 'routegate_policy_reloads_total{result="ok"} 1.0' in exposition
    assert 'routegate_policy_reloads_total{result="invalid"} 1.0' in exposition


async def test_admin_endpoints_need_the_admin_key(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, policy_path: Path) -> None:
    write(policy_path, version_text(openai_upstream.url, "v1"))
    gateway = await start(start_gateway, policy_path)
    async with aiohttp.ClientSession() as session:
        async with session.post(gateway.url + "/admin/policy/reload") as response:
            assert response.status == 401
        async with session.get(gateway.url + "/admin/policy",
                               headers={"Authorization": "Bearer nope"}) as response:
            assert response.status == 403
            assert (await response.json())["error"]["type"] == "permission_error"


async def test_request_in_flight_finishes_under_the_policy_it_started_with(
        start_upstream: StartUpstream, start_gateway: StartGateway, policy_path: Path) -> None:
    slow = await start_upstream(Behaviour(first_byte_delay_s=0.4), name="slow")
    other = await start_upstream(name="other")
    write(policy_path, version_text(slow.url, "v1"))
    gateway = await start(start_gateway, policy_path)
    async with aiohttp.ClientSession() as session:
        in_flight = asyncio.create_task(
            session.post(gateway.base_url + "/chat/completions", json=CHAT))
        await until(lambda: bool(slow.received))
        write(policy_path, version_text(other.url, "v2"))
        status, _ = await admin(session, gateway, "POST", "/admin/policy/reload")
        assert status == 200
        response = await in_flight
        assert response.status == 200
        assert (await response.json())["model"] == "v1"
    assert [r.json["model"] for r in slow.received] == ["v1"]


async def test_reload_under_concurrent_traffic_fails_no_request_and_mixes_no_policies(
        start_upstream: StartUpstream, start_gateway: StartGateway, policy_path: Path) -> None:
    delay = Behaviour(first_byte_delay_s=0.005)
    upstreams = {"v1": await start_upstream(delay, name="one"),
                 "v2": await start_upstream(delay, name="two")}
    texts = {version: version_text(fake.url, version) for version, fake in upstreams.items()}
    write(policy_path, texts["v1"])
    gateway = await start(start_gateway, policy_path)
    reloader = gateway.app[RELOADER]
    statuses: list[int] = []
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            async with session.post(gateway.base_url + "/chat/completions",
                                    json=CHAT) as response:
                statuses.append(response.status)
                await response.read()

    async def flipper() -> None:
        for round_ in range(30):
            version = "v2" if round_ % 2 == 0 else "v1"
            write(policy_path, texts[version] if round_ % 5 else "version: [broken\n")
            await reloader.reload("test")
            await asyncio.sleep(0.01)
        stop.set()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(flipper(), *(client(session) for _ in range(8)))
    assert len(statuses) > 50
    assert set(statuses) == {200}
    # A half-loaded policy would send one version's upstream name to the other's backend.
    for version, fake in upstreams.items():
        assert {r.json["model"] for r in fake.received} == {version}


async def test_file_change_is_picked_up_by_the_watcher(
        start_upstream: StartUpstream, start_gateway: StartGateway, policy_path: Path) -> None:
    one, two = await start_upstream(name="one"), await start_upstream(name="two")
    write(policy_path, version_text(one.url, "v1"))
    gateway = await start(start_gateway, policy_path, watch=True)
    live = gateway.app[RELOADER].live
    before = live.current.version_hash
    await asyncio.sleep(0.2)  # the watcher is running before the file changes
    replacement = policy_path.with_suffix(".new")
    write(replacement, version_text(two.url, "v2"))
    replacement.replace(policy_path)  # the way editors and ConfigMaps write it
    await until(lambda: live.current.version_hash != before)
    assert live.current.targets.keys() == {"bv2/m"}


async def test_sighup_reloads_the_file(
        start_upstream: StartUpstream, start_gateway: StartGateway, policy_path: Path) -> None:
    one, two = await start_upstream(name="one"), await start_upstream(name="two")
    write(policy_path, version_text(one.url, "v1"))
    gateway = await start(start_gateway, policy_path)
    live = gateway.app[RELOADER].live
    write(policy_path, version_text(two.url, "v2"))
    os.kill(os.getpid(), signal.SIGHUP)
    await until(lambda: "bv2/m" in live.current.targets)
    assert live.current.targets.keys() == {"bv2/m"}


async def test_sighup_with_the_file_unchanged_logs_that_the_policy_is_unchanged(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, policy_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    write(policy_path, version_text(openai_upstream.url, "v1"))
    gateway = await start(start_gateway, policy_path)
    version = gateway.app[RELOADER].live.current.version_hash
    with caplog.at_level(logging.INFO, logger="routegate.policy"):
        os.kill(os.getpid(), signal.SIGHUP)
        await until(lambda: any("unchanged" in r.getMessage() for r in caplog.records))
    [line] = [r.getMessage() for r in caplog.records if "unchanged" in r.getMessage()]
    assert line.startswith("policy unchanged (signal)") and version in line


async def test_gateway_without_a_policy_file_has_nothing_to_reload(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(version_text(openai_upstream.url, "v1"))
    async with aiohttp.ClientSession() as session:
        status, body = await admin(session, gateway, "POST", "/admin/policy/reload")
        assert status == 404 and body["error"]["code"] == "no_policy_file"
        status, body = await admin(session, gateway, "GET", "/admin/policy")
        assert status == 200 and body["path"] is None


async def test_watcher_follows_every_configmap_update(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    # Kubernetes mounts a ConfigMap as policy.yaml → ..data/policy.yaml, ..data → a
    # timestamped directory; an update writes a new directory, swaps ..data by rename and
    # deletes the old directory, so a watch on the old one sees no later update.
    upstreams = [await start_upstream(name=f"v{number}") for number in range(3)]

    def publish(number: int) -> None:
        version_dir = tmp_path / f"..2026_{number}"
        version_dir.mkdir()
        write(version_dir / "policy.yaml", version_text(upstreams[number].url, f"v{number}"))
        (tmp_path / "..data_tmp").symlink_to(version_dir.name)
        (tmp_path / "..data_tmp").replace(tmp_path / "..data")
        if number:
            old = tmp_path / f"..2026_{number - 1}"
            (old / "policy.yaml").unlink()
            old.rmdir()

    publish(0)
    policy_path = tmp_path / "policy.yaml"
    policy_path.symlink_to("..data/policy.yaml")
    gateway = await start(start_gateway, policy_path, watch=True)
    live = gateway.app[RELOADER].live
    await asyncio.sleep(0.2)  # the watcher is running before the first update
    for number in (1, 2):
        publish(number)
        await until(lambda: f"bv{number}/m" in live.current.targets)  # noqa: B023
        assert live.current.targets.keys() == {f"bv{number}/m"}


async def test_watcher_sees_edits_to_the_file_a_symlink_points_at(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    one, two = await start_upstream(name="one"), await start_upstream(name="two")
    (tmp_path / "real").mkdir()
    (tmp_path / "etc").mkdir()
    real = tmp_path / "real" / "policy.yaml"
    write(real, version_text(one.url, "v1"))
    policy_path = tmp_path / "etc" / "policy.yaml"
    policy_path.symlink_to(real)
    gateway = await start(start_gateway, policy_path, watch=True)
    live = gateway.app[RELOADER].live
    await asyncio.sleep(0.2)  # the watcher is running before the file changes
    write(real, version_text(two.url, "v2"))
    await until(lambda: "bv2/m" in live.current.targets)
    assert live.current.targets.keys() == {"bv2/m"}
