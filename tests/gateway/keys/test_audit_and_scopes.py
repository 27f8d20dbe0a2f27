"""Who may use the admin API, and the audit log of what they did."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gateway.settings import Settings
from tests.conftest import StartGateway
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.keys.admin_client import ADMIN_KEY, POLICY_KEY, AdminApi, keys_policy


def _audit(directory: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in
            (directory / "audit.log").read_text().splitlines()]


async def test_every_change_is_one_audit_line_with_who_what_and_before_after(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, tmp_path: Path) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url),
                                  Settings(port=0, data_dir=tmp_path))
    admin = AdminApi(gateway.url)
    created = await admin.create(name="a")
    await admin.call("PATCH", f"/admin/keys/{created['id']}", {"name": "b"})
    status, rotated = await admin.call("POST", f"/admin/keys/{created['id']}/rotate")
    assert status == 200
    await admin.call("POST", f"/admin/keys/{created['id']}/revoke")
    lines = _audit(tmp_path)
    assert [line["action"] for line in lines] == ["create", "update", "rotate", "revoke"]
    assert all(line["who"].startswith("admin_key:") and line["remote"] == "127.0.0.1"
               and line["target"] == created["id"] for line in lines)
    assert lines[1]["before"]["name"] == "a" and lines[1]["after"]["name"] == "b"
    text = (tmp_path / "audit.log").read_text()
    for secret in (created["key"], rotated["key"], ADMIN_KEY):
        assert secret not in text
    assert "sha256" not in text


async def test_concurrent_updates_both_succeed_the_last_wins_and_both_are_audited(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, tmp_path: Path) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url),
                                  Settings(port=0, data_dir=tmp_path))
    admin = AdminApi(gateway.url)
    created = await admin.create()
    answers = await asyncio.gather(*(admin.call("PATCH", f"/admin/keys/{created['id']}",
                                                {"name": name}) for name in ("x", "y")))
    assert [status for status, _ in answers] == [200, 200]
    updates = [line for line in _audit(tmp_path) if line["action"] == "update"]
    assert len(updates) == 2
    status, shown = await admin.call("GET", f"/admin/keys/{created['id']}")
    assert status == 200 and shown["name"] == updates[-1]["after"]["name"]


async def test_a_managed_admin_key_reads_and_writes_by_its_scope_within_its_tenant(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    root = AdminApi(gateway.url)
    reader = AdminApi(gateway.url, (await root.create(scopes=["admin:read"]))["key"])
    writer = AdminApi(gateway.url, (await root.create(scopes=["admin:write"]))["key"])
    other = await root.create(tenant="globex")
    assert (await reader.call("GET", "/admin/keys"))[0] == 200
    assert (await reader.call("POST", "/admin/keys", {"tenant": "acme"}))[0] == 403
    assert (await writer.call("POST", "/admin/keys", {"tenant": "acme"}))[0] == 201
    assert (await writer.call("POST", "/admin/keys", {"tenant": "globex"}))[0] == 403
    assert (await writer.call("POST", f"/admin/keys/{other['id']}/revoke"))[0] == 404
    listed = (await writer.call("GET", "/admin/keys"))[1]["data"]
    assert {key["tenant"] for key in listed} == {"acme"}
    plain = AdminApi(gateway.url, (await root.create())["key"])
    assert (await plain.call("GET", "/admin/keys"))[0] == 403
    assert (await AdminApi(gateway.url, POLICY_KEY).call("GET", "/admin/keys"))[0] == 403


async def test_failed_admin_authentications_are_audited_and_throttled(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, tmp_path: Path) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url),
                                  Settings(port=0, data_dir=tmp_path))
    guesser = AdminApi(gateway.url, "guess")
    statuses = [(await guesser.call("GET", "/admin/keys"))[0] for _ in range(11)]
    assert statuses == [403] * 10 + [429]
    # throttled by address: the right key from there waits too
    assert (await AdminApi(gateway.url).call("GET", "/admin/keys"))[0] == 429
    outcomes = [line["outcome"] for line in _audit(tmp_path)]
    assert outcomes == ["refused_403"] * 10 + ["throttled"] * 2


async def test_admin_actions_are_counted_in_metrics(openai_upstream: FakeOpenAI,
                                                    start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keys_policy(openai_upstream.url))
    await AdminApi(gateway.url).create()
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
        text = await r.text()
    assert 'routegate_admin_actions_total{action="create",outcome="ok"} 1.0' in text
