"""Headless Chromium, driven from the command line (`--dump-dom`, `--screenshot`)."""

from __future__ import annotations

import asyncio
import shutil
import struct
import zlib
from pathlib import Path

import pytest

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,1000",
    # Let the page's timers and fetches run before the DOM is dumped / the shot is taken.
    "--virtual-time-budget=6000",
]


def chromium_or_skip() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("chromium is not installed (apt-get install chromium); dashboard not browsed")


async def run_chromium(binary: str, profile: Path, *args: str, timeout_s: float = 60.0) -> str:
    process = await asyncio.create_subprocess_exec(
        binary, *FLAGS, f"--user-data-dir={profile}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout_s):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
    return stdout.decode(errors="replace")


def png_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct pixel rows): a cheap test that the PNG holds a picture."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = len(raw) // height
    rows = {raw[i * stride + 1:(i + 1) * stride] for i in range(height)}
    return width, height, len(rows)
