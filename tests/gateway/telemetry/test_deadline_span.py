"""The budget left travels on the upstream span too, as `routegate.deadline_ms`."""

from __future__ import annotations

from tests.conftest import StartUpstream, single_backend_policy
from tests.gateway.telemetry.conftest import StartTraced
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver
from tests.gateway.telemetry.test_gateway_telemetry import CHAT, post


async def test_the_upstream_span_carries_the_budget_left(
    start_upstream: StartUpstream, start_traced: StartTraced,
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, otlp_url = otlp_receiver
    upstream = await start_upstream()
    policy = single_backend_policy(upstream.url)
    policy["routes"]["chat"]["latency_budget"] = {"total_ms": 3000}
    traced = await start_traced(policy, otlp_url)

    status, _, _ = await post(traced.gateway.url, CHAT)
    await traced.flush()
    spans = await receiver.wait_for(lambda s: any(x.kind == "SERVER" for x in s))

    assert status == 200
    (client,) = [s for s in spans if s.kind == "CLIENT"]
    sent = int(upstream.received[0].headers["x-routegate-deadline-ms"])
    assert client.attributes["routegate.deadline_ms"] == sent
    assert 2900 < sent <= 3000
