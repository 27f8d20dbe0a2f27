"""`routegate serve` as a real process, and the CLI's error paths."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.cli import build_parser, main
from gateway.launch.supervisor import free_port
from gateway.settings import default_policy_path
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
    assert b"listening on 127.0.0.1:" in stderr
    for line in (f"API base URL  {url}/v1", f"dashboard     {url}/dashboard",
                 f"metrics       {url}/metrics"):
        assert line.encode() in stderr, stderr.decode()


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == "routegate 0.1.0"


def test_serve_help_documents_every_flag() -> None:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    for action in serve._actions:
        assert action.help, f"{action.option_strings} has no help text"
    text = serve.format_help()
    assert "ROUTEGATE_POLICY" in text and "SIGHUP" in text


REPO = Path(__file__).resolve().parents[2]


def make_run_command(environ: dict[str, str], *args: str) -> str:
    """The `routegate serve` line `make run` would execute (dry run, nothing started)."""
    env = {k: v for k, v in os.environ.items() if k not in ("POLICY", "ROUTEGATE_POLICY")}
    out = subprocess.run(["make", "-n", "-C", str(REPO), "run", *args], env=env | environ,
                         capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if "routegate serve" in line)


def test_make_run_takes_the_policy_from_policy_then_routegate_policy() -> None:
    assert "--policy a.yaml" in make_run_command({}, "POLICY=a.yaml")
    assert "--policy b.yaml" in make_run_command({"ROUTEGATE_POLICY": "b.yaml"})
    assert "--policy a.yaml" in make_run_command({"ROUTEGATE_POLICY": "b.yaml"}, "POLICY=a.yaml")
    assert "--policy" not in make_run_command({})  # serve's own default: the bundled policy
