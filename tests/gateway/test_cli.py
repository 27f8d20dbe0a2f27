"""`routegate serve` as a real process, and the CLI's error paths."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import yaml

from gateway.cli import main
from gateway.settings import default_policy_path
from gateway.supervisor import free_port
from tests.conftest import single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI


def test_the_default_policy_is_found_through_the_installed_package() -> None:
    assert default_policy_path().is_file()
    assert default_policy_path().name == "default.yaml"


def test_an_unreadable_policy_exits_with_status_2(tmp_path: Path) -> None:
    assert main(["serve", "--policy", str(tmp_path / "missing.yaml")]) == 2


async def test_serve_proxies_requests_and_stops_cleanly_on_sigterm(
        openai_upstream: FakeOpenAI, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(single_backend_policy(openai_upstream.url)))
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port),
        stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with asyncio.timeout(20):
                while True:
                    try:
                        async with session.get(url + "/healthz") as health:
                            if health.status == 200:
                                break
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.05)
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0, stderr.decode()
    assert b"routegate listening on" in stderr
