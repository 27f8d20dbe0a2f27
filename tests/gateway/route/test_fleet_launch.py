"""`launch: {replicas: N}`: N children, each its own replica on its own port, each
restarted on its own; the backend is up while any one of them is."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from gateway.app import SUPERVISOR
from gateway.route.replica_watch import FLEETS
from gateway.settings import Settings
from tests.conftest import StartGateway
from tests.waiting import until

CHILD = str(Path(__file__).resolve().parents[2] / "fakes" / "child_backend.py")


async def test_each_launched_replica_is_its_own_child_and_comes_back_on_its_own(
        start_gateway: StartGateway) -> None:
    gateway = await start_gateway({
        "version": 1,
        "backends": {"local": {"type": "openai", "deployment": "dedicated",
                               "models": {"demo": {}},
                               "launch": {"model": "demo", "replicas": 2,
                                          "startup_timeout_s": 10}}},
        "routes": {"chat": {"targets": ["local/demo"]}},
        "auth": {"anonymous": {"enabled": True}}},
        Settings(port=0, launch_command=(sys.executable, CHILD), restart_backoff_s=(0.05, 0.2)))
    fleet = gateway.app[FLEETS].fleets["local"]
    await until(lambda: len(fleet.replicas) == 2)
    children = gateway.app[SUPERVISOR].children
    assert set(children) == {"local#0", "local#1"}
    ports = {replica.url for replica in fleet.replicas.values()}
    assert len(ports) == 2

    first = children["local#0"]
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)
    await until(lambda: len(fleet.replicas) == 1)  # the other keeps serving
    reply = await gateway.openai().chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices
    await until(lambda: len(fleet.replicas) == 2)  # restarted on its own
    assert children["local#0"].starts == 2 and children["local#1"].starts == 1
