"""The dashboard draws each replica of a dedicated fleet: its state, load, requests and
cache hits, the same figures `/admin/backends` reports."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from gateway.core.auth import key_hash
from tests.conftest import StartGateway, StartUpstream
from tests.gateway.dashboard.chromium import chromium_or_skip, run_chromium
from tests.gateway.dashboard.test_dashboard_on_call import ADMIN, rows


@pytest.mark.slow
async def test_every_replica_is_a_row_with_the_admin_views_figures(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    binary = chromium_or_skip()
    first, second = await start_upstream(name="r1"), await start_upstream(name="r2")
    policy = {
        "version": 1,
        "backends": {"pods": {"type": "openai", "deployment": "dedicated",
                              "urls": [first.url, second.url], "pick": "round_robin",
                              "models": {"m": {}}}},
        "routes": {"chat": {"targets": ["pods/m"]}},
        "auth": {"anonymous": {"enabled": True}, "admin_keys": [key_hash(ADMIN)]}}
    gateway = await start_gateway(policy)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as session:
        for _ in range(5):
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(gateway.base_url + "/chat/completions",
                                    json=body) as response:
                assert response.status == 200
        async with session.get(gateway.url + "/admin/backends", headers=admin) as response:
            replicas = (await response.json())["backends"]["pods"]["fleet"]["replicas"]

    dom = await run_chromium(binary, tmp_path / "p", "--window-size=900,1600", "--dump-dom",
                             gateway.url + f"/dashboard#key={ADMIN}")
    table = {row[0]: row for row in rows(dom, "replicas")}
    assert set(table) == {f"pods {name}" for name in replicas}
    assert sorted(int(row[4]) for row in table.values()) == [2, 3]
    for name, state in replicas.items():
        row = table[f"pods {name}"]
        assert row[1] == state["state"].replace("_", " ") == "in service"
        assert int(row[4]) == state["requests"]
        assert row[6] == str(state["index_blocks"])
    assert 'data-overflowing="0"' in dom
