"""Connecting to Redis: `connect(url)` for standalone, Cluster and Sentinel URLs.

    redis://HOST:PORT[/DB]                                   one server

    redis+cluster://HOST:PORT[,HOST:PORT…][?password=…]     any nodes of the cluster
    redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB]    sentinels, the master's name

Every key the limit store writes carries its tenant as a hash tag (`rg:{tenant}:…`),
so one admission's keys share a slot and its script is still one round trip, on
whichever master holds that slot. The cluster client follows MOVED/ASK and refreshes
its slot map after a failover; the Sentinel client asks the sentinels for the current
master on each new connection. Both fail fast like the standalone client: short socket
timeouts, and no retries of their own, so an outage reaches the failover wrapper.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

CLUSTER_SCHEME = "redis+cluster"
SENTINEL_SCHEME = "redis+sentinel"
SCHEMES = (f"{CLUSTER_SCHEME}://", f"{SENTINEL_SCHEME}://")
# Commands in flight at once through a cluster client (its callers wait for a turn).
CLUSTER_CONNECTIONS_PER_NODE = 16


def _nodes(netloc: str) -> tuple[list[tuple[str, int]], str | None]:
    """`[:password@]host:port,host:port` → the nodes and the password."""
    password = None
    if "@" in netloc:
        credentials, netloc = netloc.rsplit("@", 1)
        password = unquote(credentials.split(":", 1)[-1]) or None
    nodes = []
    for node in netloc.split(","):
        host, _, port = node.rpartition(":")
        nodes.append((host.strip("[]") or "127.0.0.1", int(port or 6379)))
    return nodes, password


def connect_cluster(url: str, *, socket_timeout_s: float) -> RedisCluster:
    parts = urlsplit(url)
    nodes, password = _nodes(parts.netloc)
    password = password or next(iter(parse_qs(parts.query).get("password", [])), None)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes], password=password,
        socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
        # room for the slot-map refresh beside the commands in flight
        max_connections=2 * CLUSTER_CONNECTIONS_PER_NODE, retry=Retry(NoBackoff(), 0))


def connect_sentinel(url: str, *, socket_timeout_s: float,
                     max_connections: int) -> aioredis.Redis:
    parts = urlsplit(url)
    nodes, password = _nodes(parts.netloc)
    path = [segment for segment in parts.path.split("/") if segment]
    if not path:
        raise ValueError(f"{url}: name the master's service, e.g. {SENTINEL_SCHEME}://"
                         "sentinel:26379/mymaster")
    db = int(path[1]) if len(path) > 1 else 0
    sentinel = Sentinel(nodes, socket_timeout=socket_timeout_s,
                        sentinel_kwargs={"socket_timeout": socket_timeout_s,
                                         "socket_connect_timeout": socket_timeout_s})
    return sentinel.master_for(
        path[0], db=db, password=password, socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s, max_connections=max_connections,
        retry=Retry(NoBackoff(), 0))


RedisClient = aioredis.Redis | RedisCluster


def connect(url: str, *, socket_timeout_s: float = 0.5, max_connections: int = 16,
            pool_wait_s: float = 1.0) -> RedisClient:
    """A client that fails fast: short socket timeouts, no retries, a bounded pool.

    A few connections suffice (a round trip takes ~0.2 ms on a LAN) and opening fewer
    at once matters: under a burst on a busy event loop, dozens of simultaneous
    connects is what times out first. The timeouts allow for that loop being busy:
    a stalled loop must not pass for a dead Redis.
    """
    if url.startswith(f"{CLUSTER_SCHEME}://"):
        return connect_cluster(url, socket_timeout_s=socket_timeout_s)
    if url.startswith(f"{SENTINEL_SCHEME}://"):
        return connect_sentinel(url, socket_timeout_s=socket_timeout_s,
                                max_connections=max_connections)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_wait_s,
        socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    return aioredis.Redis(connection_pool=pool)
