"""The request record: what crosses to the trace exporter process, and what it derives."""

from __future__ import annotations

import marshal

from gateway.core.record import AttemptRecord, RequestRecord
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing
from gateway.telemetry.tracing.setup import sampler_from_env
from gateway.telemetry.tracing.span_build import spans_of
from gateway.telemetry.tracing.trace_context import Sampling
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.sampling import INBOUND, Kept
from tests.gateway.telemetry.scripted_request import scripted_request


def counting() -> object:
    ids = iter(range(1, 1000))
    return lambda: next(ids)


async def test_the_exporter_process_builds_the_same_spans_from_what_crosses_to_it() -> None:
    kept = Kept()
    telemetry = Telemetry(tracing=Tracing(Sampling(sampler_from_env({})), kept))
    await scripted_request(telemetry, FakeClock(), headers=INBOUND, record_content=True)
    (record,) = kept.records
    record.cache, record.error_code = "miss", "upstream_error"
    arrived = RequestRecord.from_plain(marshal.loads(marshal.dumps(record.plain(), 4)))
    assert spans_of(arrived, counting()) == spans_of(record, counting())  # type: ignore[arg-type]


def test_a_retry_of_the_same_target_is_not_a_fallback() -> None:
    record = RequestRecord(request_id="r", method="POST", path="/p")
    for key in ("local/llama", "local/llama", "openai/gpt", "openai/mini"):
        backend, model = key.split("/")
        record.attempts.append(AttemptRecord(key, backend, model, model, "openai",
                                             len(record.attempts) + 1))
    assert record.fallbacks() == [("local", "openai"), ("openai", "openai")]
    assert (record.backend, record.model) == ("openai", "mini")


def test_without_tracing_the_callers_trace_id_is_still_the_requests() -> None:
    record = Telemetry().begin(request_id="r", method="POST", path="/p", headers=INBOUND)
    assert record.trace is None and record.trace_id == INBOUND["traceparent"].split("-")[1]
    assert not record.sampled and record.step("routegate.auth") is record.step("x")
