"""Drives a request record through the steps the pipeline takes, with plain values."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.core.attempt_facts import Attempt
from gateway.core.record import RequestRecord
from gateway.pipeline.queue_wait import QueuedSlot
from gateway.pipeline.request_facts import note_request
from gateway.telemetry.service import Telemetry
from policies.load import ModelTarget
from policies.schema import Backend, ModelSpec
from routing.cost import charged_micros
from tests.gateway.telemetry.fake_clock import FakeClock

PROMPT = "my secret plan is to buy 400 llamas"
COMPLETION = "the llamas arrive on tuesday"
TOKEN_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'


class WaitingSlot:
    """A queue slot that takes `wait` (the fake clock's advance) to come free."""

    def __init__(self, wait: Callable[[], None]) -> None:
        self._wait = wait

    async def __aenter__(self) -> None:
        self._wait()

    async def __aexit__(self, *exc: object) -> None:
        return None


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
) -> RequestRecord:
    tick = clock.advance_ms if clock else (lambda ms: None)
    record = telemetry.begin(request_id="req-1", method="POST", path="/v1/chat/completions",
                             headers=headers or {}, record_content=record_content)
    timings = record.timings
    assert timings is not None
    with record.step("routegate.auth"):
        tick(1)
    record.tenant = "acme"
    note_request(record, "chat.completions", "chat", True,
                 {"max_tokens": 64, "prompt": PROMPT})
    with record.step("routegate.rate_limit"):
        tick(1)
    with record.step("routegate.route"):
        record.route, record.decided_backend, record.reason = "chat", backend, "cheapest"
        record.decision_id, record.predicted_ttft_ms = "d-1", 90.0
        if record.sampled:
            record.candidates = (f"{backend}/llama",)
    metrics = telemetry.metrics
    async with QueuedSlot(record, timings, backend, metrics.queue_depth_of(backend),
                          WaitingSlot(lambda: tick(5))):
        pass
    out: dict[str, str] = dict(headers or {})
    facts = Attempt.start(record, target(backend), timings, metrics.in_flight_of(backend),
                               out, telemetry.new_span_id)
    if injected is not None:
        injected.update(out)
    tick(40)
    facts.responded(upstream_headers or {"server-timing": "queue;dur=2, prefill;dur=30"})
    for _ in range(3):
        tick(10)
        facts.relayed(TOKEN_EVENT)
    facts.body(final_body or {
        "id": "cmpl-1", "model": "llama-served",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
        "timings": {"inference_ms": 55.5, "decode_ms": 25.5},
    })
    facts.end()
    spec = target(backend)
    # what settlement charges: 12 in, 3 out at $100/$300 per Mtok
    record.cost_micros = charged_micros(spec.backend, spec.spec, 12, 3)
    if record.keeps_content:
        record.completion = COMPLETION
    tick(1)
    record.status = status
    telemetry.finish(record)
    return record
