"""Drives a `RequestTelemetry` through the steps the pipeline takes, with plain values."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.telemetry.request import RequestTelemetry
from gateway.telemetry.service import Telemetry
from policies.load import ModelTarget
from policies.schema import Backend, ModelSpec
from tests.gateway.telemetry.fake_clock import FakeClock

PROMPT = "my secret plan is to buy 400 llamas"
COMPLETION = "the llamas arrive on tuesday"


def target(backend: str) -> ModelTarget:
    spec = ModelSpec(input_usd_per_mtok=100.0, output_usd_per_mtok=300.0)
    return ModelTarget(key=f"{backend}/llama", backend_name=backend, model_name="llama",
                       upstream_name="llama", spec=spec,
                       backend=Backend(type="openai", url="http://127.0.0.1:9/v1",
                                       models={"llama": spec}))


async def scripted_request(
    telemetry: Telemetry,
    clock: FakeClock | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    backend: str = "local",
    status: int = 200,
    upstream_headers: Mapping[str, str] | None = None,
    final_body: Mapping[str, object] | None = None,
    record_content: bool = False,
    injected: dict[str, str] | None = None,
) -> RequestTelemetry:
    tick = clock.advance_ms if clock else (lambda ms: None)
    tel = telemetry.begin(request_id="req-1", method="POST", path="/v1/chat/completions",
                          headers=headers or {}, record_content=record_content)
    with tel.step("routegate.auth"):
        tick(1)
    tel.identify(tenant="acme", requested_model="chat", stream=True, max_tokens=64)
    with tel.step("routegate.rate_limit"):
        tick(1)
    with tel.step("routegate.route") as span:
        tel.routed(span, route="chat", backend=backend, model="llama", reason="cheapest",
                   decision_id="d-1", predicted_ttft_ms=90.0, candidates=[f"{backend}/llama"])
    async with tel.queue_wait(backend):
        tick(5)
    out: dict[str, str] = {}
    attempt = tel.upstream(target(backend), out)
    if injected is not None:
        injected.update(out)
    tick(40)
    attempt.responded(upstream_headers or {"server-timing": "queue;dur=2, prefill;dur=30"})
    for _ in range(3):
        tick(10)
        attempt.token()
    attempt.body(final_body or {
        "id": "cmpl-1", "model": "llama-served",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
        "timings": {"inference_ms": 55.5, "decode_ms": 25.5},
    })
    attempt.end()
    tel.price(target(backend))  # 12 in, 3 out at $100/$300 per Mtok
    tel.content(prompt=PROMPT, completion=COMPLETION)
    tick(1)
    tel.finish(status)
    return tel
