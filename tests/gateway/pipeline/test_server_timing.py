"""Server-Timing on every response, errors included."""

from __future__ import annotations

import re

import aiohttp

from gateway.core.inference_time import InferenceReport
from gateway.core.timing import RequestTimings
from tests.conftest import RunningGateway

ENTRY = re.compile(r"^([a-z-]+);dur=(\d+\.\d{3})$")


def _entries(header: str) -> dict[str, float]:
    found = {}
    for part in header.split(", "):
        match = ENTRY.match(part)
        assert match, part
        found[match.group(1)] = float(match.group(2))
    return found


async def test_a_proxied_reply_names_gateway_upstream_and_total_time(
        gateway: RunningGateway) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=body) as response:
        entries = _entries(response.headers["Server-Timing"])

    assert list(entries) == ["gw", "queue", "upstream-fb", "upstream", "total"]
    assert entries["upstream-fb"] <= entries["upstream"] <= entries["total"]
    waited = entries.get("queue", 0.0)  # named waits are not gateway time
    assert abs(entries["gw"] + waited + entries["upstream"] - entries["total"]) < 0.01


async def test_an_error_reply_carries_server_timing_too(gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", data=b"{") as response:
        entries = _entries(response.headers["Server-Timing"])
    assert response.status == 400 and set(entries) == {"gw", "queue", "upstream", "total"}


def test_waits_are_not_counted_as_gateway_time() -> None:
    timing = RequestTimings(start=0.0)
    timing.add_wait("queue", 10.0)
    timing.report(InferenceReport(inference_ms=5.0, source="reported"))
    entries = _entries(timing.server_timing())
    assert entries["queue"] == 10_000.0 and entries["inference"] == 5.0
    assert abs(entries["gw"] - (entries["total"] - 10_000.0)) < 0.01
