"""`routegate keys create|list|rotate|revoke` against a running gateway."""

from __future__ import annotations

import asyncio

import pytest

from gateway.cli import main
from tests.conftest import StartGateway
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.keys.admin_client import ADMIN_KEY, chat, keys_policy


async def _routegate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, list(argv))  # the gateway runs on this loop
    return code, capsys.readouterr().out


def _fields(out: str) -> dict[str, str]:
    """`id:  key_…` / `key: rg-…` lines as a dict."""
    return {name: value.strip() for name, _, value in
            (line.partition(":") for line in out.splitlines() if not line.startswith("#"))}


async def test_a_key_is_created_listed_rotated_and_revoked_from_the_shell(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    monkeypatch.setenv("ROUTEGATE_URL", gateway.url)
    monkeypatch.setenv("ROUTEGATE_ADMIN_KEY", ADMIN_KEY)
    code, out = await _routegate(capsys, "keys", "create", "--tenant", "acme", "--name", "app",
                                 "--label", "team-a", "--rpm", "100", "--usd-per-day", "5")
    assert code == 0
    fields = _fields(out)
    key_id, key = fields["id"], fields["key"]
    assert (await chat(gateway.url, key))[0] == 200
    code, out = await _routegate(capsys, "keys", "list", "--tenant", "acme")
    header, row = out.splitlines()
    assert header.split() == ["ID", "TENANT", "NAME", "STATUS", "LABELS", "EXPIRES"]
    assert row.split() == [key_id, "acme", "app", "active", "team-a", "-"]
    code, out = await _routegate(capsys, "keys", "rotate", key_id)
    new_key = _fields(out)["key"]
    assert (await chat(gateway.url, key))[0] == 401
    assert (await chat(gateway.url, new_key))[0] == 200
    code, out = await _routegate(capsys, "keys", "revoke", key_id)
    assert (code, out.strip()) == (0, f"revoked {key_id}")
    assert (await chat(gateway.url, new_key))[0] == 401


async def test_an_error_from_the_api_is_printed_and_exits_1(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        capsys: pytest.CaptureFixture[str]) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    code = await asyncio.to_thread(main, ["keys", "create", "--tenant", "nobody", "--url",
                                          gateway.url, "--admin-key", ADMIN_KEY])
    assert code == 1
    assert "400: `tenant`: no tenant 'nobody'" in capsys.readouterr().err
