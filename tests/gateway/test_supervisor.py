"""Launching `launch:` backends as children: start, health, restart on death, stop."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from gateway.app import LIVE_POLICY, SUPERVISOR
from gateway.launch.supervisor import Supervisor
from gateway.settings import Settings
from tests.conftest import RunningGateway, StartGateway, as_policy
from tests.waiting import until

CHILD = str(Path(__file__).resolve().parent.parent / "fakes" / "child_backend.py")
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def launch_policy(*args: str) -> dict[str, Any]:
    return {
        "version": 1,
        "backends": {"local": {"type": "openai", "models": {"demo": {}},
                               "launch": {"model": "demo", "args": list(args),
                                          "startup_timeout_s": 10}}},
        "routes": {"chat": {"targets": ["local/demo"]}},
        "auth": {"anonymous": {"enabled": True}},
    }


def child_settings() -> Settings:
    return Settings(port=0, launch_command=(sys.executable, CHILD),
                    restart_backoff_s=(0.05, 0.2))


async def _chat(gateway: RunningGateway) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=BODY) as response:
        return response.status, await response.json()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_launched_backend_serves_once_healthy(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(launch_policy(), child_settings())
    supervisor: Supervisor = gateway.app[SUPERVISOR]
    await until(lambda: supervisor.children["local"].url is not None)

    status, body = await _chat(gateway)

    assert status == 200
    assert body["choices"][0]["message"]["content"] == f"pid {supervisor.children['local'].pid}"


async def test_a_dead_child_is_restarted(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(launch_policy(), child_settings())
    child = gateway.app[SUPERVISOR].children["local"]
    await until(lambda: child.url is not None)
    first_pid = child.pid
    assert first_pid is not None

    os.kill(first_pid, signal.SIGKILL)
    await until(lambda: child.pid != first_pid and child.url is not None)

    status, _ = await _chat(gateway)
    assert status == 200 and child.starts == 2


async def test_children_are_stopped_on_shutdown(start_gateway: StartGateway) -> None:
    settings = child_settings()
    gateway = await start_gateway(launch_policy(), settings)
    supervisor: Supervisor = gateway.app[SUPERVISOR]
    await until(lambda: supervisor.children["local"].url is not None)
    pid = supervisor.children["local"].pid
    assert pid is not None

    await supervisor.stop()

    assert not _alive(pid)


async def test_a_child_that_cannot_start_leaves_the_gateway_serving_503s(
        start_gateway: StartGateway) -> None:
    gateway = await start_gateway(launch_policy("--fail"), child_settings())
    child = gateway.app[SUPERVISOR].children["local"]
    await until(lambda: child.last_error is not None)

    status, body = await _chat(gateway)
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/readyz") as ready:
        readiness = await ready.json()

    assert status == 503
    message = body["error"]["message"]
    assert "'local'" in message and "exited with code 3" in message
    assert ready.status == 503 and "exited with code 3" in readiness["backends"]["local"]


def two_launched_policy() -> dict[str, Any]:
    policy = launch_policy()
    policy["backends"]["extra"] = {"type": "openai", "models": {"demo": {}},
                                   "launch": {"model": "demo", "startup_timeout_s": 10}}
    return policy


async def test_a_reload_starts_an_added_launched_backend_and_keeps_the_others(
        start_gateway: StartGateway) -> None:
    gateway = await start_gateway(launch_policy(), child_settings())
    supervisor: Supervisor = gateway.app[SUPERVISOR]
    local = supervisor.children["local"]
    await until(lambda: local.url is not None)
    pid = local.pid

    gateway.app[LIVE_POLICY].swap(as_policy(two_launched_policy()))
    await until(lambda: "extra" in supervisor.children
                 and supervisor.children["extra"].url is not None)

    assert supervisor.children["local"] is local and local.pid == pid and local.starts == 1
    extra_pid = supervisor.children["extra"].pid
    assert extra_pid is not None and extra_pid != pid and _alive(extra_pid)


async def test_a_reload_stops_a_removed_launched_backend(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(two_launched_policy(), child_settings())
    supervisor: Supervisor = gateway.app[SUPERVISOR]
    await until(lambda: all(child.url is not None for child in supervisor.children.values()))
    extra_pid, local_pid = supervisor.children["extra"].pid, supervisor.children["local"].pid
    assert extra_pid is not None and local_pid is not None

    gateway.app[LIVE_POLICY].swap(as_policy(launch_policy()))
    await until(lambda: not _alive(extra_pid))

    assert supervisor.children.keys() == {"local"} and _alive(local_pid)
    status, body = await _chat(gateway)
    assert status == 200 and body["choices"][0]["message"]["content"] == f"pid {local_pid}"


async def test_a_reload_that_changes_launch_restarts_that_child(
        start_gateway: StartGateway) -> None:
    gateway = await start_gateway(launch_policy(), child_settings())
    supervisor: Supervisor = gateway.app[SUPERVISOR]
    await until(lambda: supervisor.children["local"].url is not None)
    old_pid = supervisor.children["local"].pid
    assert old_pid is not None

    changed = launch_policy()
    changed["backends"]["local"]["launch"]["startup_timeout_s"] = 9
    gateway.app[LIVE_POLICY].swap(as_policy(changed))
    await until(lambda: supervisor.children["local"].url is not None
                 and supervisor.children["local"].pid != old_pid)

    assert not _alive(old_pid)
    status, body = await _chat(gateway)
    assert status == 200
    assert body["choices"][0]["message"]["content"] == f"pid {supervisor.children['local'].pid}"
