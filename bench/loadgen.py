"""The benchmarks' load generator and process helpers.

A minimal keep-alive HTTP/1.1 client (cheaper per request than aiohttp's, so the
client is not what a benchmark measures), and the few things each benchmark needs
around the processes under test: free ports, core pinning, readiness, CPU and RSS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

KEY = "bench-key"  # the API key the benchmark policies list (by hash)


def _request_bytes(port: int, stream: bool, authorized: bool, extra_fields: bytes = b"",
                   extra_headers: bytes = b"") -> bytes:
    """`extra_fields`: more JSON members (`,"temperature":0`); `extra_headers`: lines
    ending in CRLF."""
    body = (b'{"model":"chat","messages":[{"role":"system","content":"You are terse."},'
            b'{"role":"user","content":"Say hello in a few words, please."}],"max_tokens":32'
            + (b',"stream":true' if stream else b"") + extra_fields + b"}")
    auth = f"Authorization: Bearer {KEY}\r\n".encode() if authorized else b""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port + auth
            + extra_headers
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    payload: bytes) -> tuple[float, float]:
    """One request on a kept-alive connection: (seconds to first body byte, total)."""
    start = time.perf_counter()
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    if head[9:12] != b"200":
        raise RuntimeError(f"HTTP {head[9:12].decode()}: {head[:200]!r}")
    lower = head.lower()
    first = None
    if b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            await reader.readexactly(size + 2)
            if first is None:
                first = time.perf_counter()
    else:
        marker = lower.index(b"content-length:") + 15
        length = int(lower[marker:lower.index(b"\r\n", marker)])
        await reader.readexactly(length)
    end = time.perf_counter()
    return (first or end) - start, end - start


@dataclass
class Result:
    rps: float
    latencies_ms: list[float]
    first_byte_ms: list[float]
    cpu_us: float = 0.0  # CPU of the process under test per request (upstream for direct)

    def pct(self, q: float, first: bool = False) -> float:
        values = sorted(self.first_byte_ms if first else self.latencies_ms)
        return values[min(len(values) - 1, int(q * len(values)))]


async def load(port: int, concurrency: int, total: int, *, stream: bool = False,
               authorized: bool = True, extra_fields: bytes = b"",
               extra_headers: bytes = b"") -> Result:
    payload = _request_bytes(port, stream, authorized, extra_fields, extra_headers)
    per_worker = max(1, total // concurrency)
    latencies: list[float] = []
    first_bytes: list[float] = []

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(per_worker):
                first, whole = await _exchange(reader, writer, payload)
                latencies.append(whole * 1000)
                first_bytes.append(first * 1000)
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return Result(len(latencies) / elapsed, latencies, first_bytes)


async def paced(port: int, rate: float, total: int, *, connections: int = 32,
                stream: bool = False, authorized: bool = True) -> Result:
    """`total` requests due at `rate` a second (request k at k / rate), spread over
    kept-alive connections: the same load whatever the replies' pace. A request sent late
    because its connection was still waiting for the reply before counts from when it
    was due, so a gateway that falls behind shows; one sent after a sleep counts from its
    sending (the sleep's own lateness, about a millisecond, is the timer's, not the
    gateway's)."""
    payload = _request_bytes(port, stream, authorized)
    latencies: list[float] = []
    first_bytes: list[float] = []
    started = time.perf_counter() + 0.05

    async def worker(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for k in range(index, total, connections):
                due = started + k / rate
                delay = due - time.perf_counter()
                late = 0.0
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    late = -delay
                first, whole = await _exchange(reader, writer, payload)
                latencies.append((late + whole) * 1000)
                first_bytes.append((late + first) * 1000)
        finally:
            writer.close()

    await asyncio.gather(*(worker(i) for i in range(min(connections, total))))
    return Result(len(latencies) / (time.perf_counter() - started), latencies, first_bytes)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pinned(command: list[str], cores: str) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        return ["taskset", "-c", cores, *command]
    return command


def wait_listening(port: int, process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def peak_rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of all the threads of `pid`, to the nanosecond, from its CPU-time
    clock: unlike req/s, not skewed by other load (/proc/<pid>/stat counts 10 ms ticks,
    too coarse for a trickle of requests)."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        return 0.0  # the process has gone
    try:
        return time.clock_gettime_ns(clock.value) / 1e9
    except OSError:
        return 0.0


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (workers, exporter processes, a private Redis)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def tree_cpu_seconds(pid: int) -> float:
    """`cpu_seconds` of `pid` and every process below it."""
    return sum(cpu_seconds(member) for member in process_tree(pid))
