"""After a fallback, every figure is the answering attempt's: real gateway, real upstreams."""

from __future__ import annotations

import logging

import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.inference_time import parse_server_timing
from tests.conftest import StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour
from tests.gateway.telemetry.conftest import ACCESS_LOGGER, StartRaw, StartTraced, Traced
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver
from tests.gateway.telemetry.test_gateway_telemetry import CHAT, post


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]


async def test_inference_time_a_failed_attempt_reported_is_not_the_answering_attempts(
    start_raw: StartRaw, start_upstream: StartUpstream, start_traced: StartTraced,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A TGI-style backend stamps its timing headers, then its proxy cuts the body: a
    # failed attempt. The fallback reports no inference time of its own.
    cut = await start_raw(web.Response(
        status=200, body=b"<html>502 Bad Gateway</html>",
        headers={"Content-Type": "application/json", "x-inference-time": "35",
                 "x-queue-time": "4"}))
    healthy = await start_upstream(name="healthy")
    policy = single_backend_policy(healthy.url, backend="good")
    policy["backends"]["cut"] = {"type": "openai", "url": cut, "models": {"gpt-4o-mini": {}}}
    policy["routes"]["chat"]["targets"] = ["cut/gpt-4o-mini", "good/gpt-4o-mini"]
    traced = await start_traced(policy)
    caplog.set_level(logging.INFO, ACCESS_LOGGER)

    status, headers, _ = await post(traced.gateway.url, CHAT)

    assert status == 200
    assert "inference" not in parse_server_timing(headers["Server-Timing"])
    (line,) = access_lines(caplog)
    assert line["backend"] == "good" and line["attempts"] == 2
    assert not [name for name in line["timing"] if name.startswith("backend_")]


async def test_a_fallback_to_another_model_of_the_same_backend_is_counted(
    start_upstream: StartUpstream, start_traced: StartTraced,
) -> None:
    # e.g. one model of a provider rate-limited, the next model of the same provider free
    upstream = await start_upstream(Behaviour(status=429, fail_times=1))
    policy = single_backend_policy(upstream.url, models=("gpt-4o", "gpt-4o-mini"))
    policy["routes"]["chat"]["targets"] = ["up/gpt-4o", "up/gpt-4o-mini"]
    traced = await start_traced(policy)

    status, _, _ = await post(traced.gateway.url, CHAT)

    assert status == 200
    assert [r.json["model"] for r in upstream.received] == ["gpt-4o", "gpt-4o-mini"]
    assert fallbacks(traced) == {("up", "up"): 1.0}


def fallbacks(traced: Traced) -> dict[tuple[str, str], float]:
    text = traced.telemetry.metrics.render()[0].decode()
    return {(s.labels["from_backend"], s.labels["to_backend"]): s.value
            for f in text_string_to_metric_families(text) if f.name == "routegate_fallbacks"
            for s in f.samples if s.name.endswith("_total")}


async def test_a_failed_attempts_span_never_carries_the_completion_text_it_cut_short(
    start_raw: StartRaw, start_upstream: StartUpstream, start_traced: StartTraced,
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, otlp_url = otlp_receiver
    secret = "the vault opens with 7731"
    cut = await start_raw(web.Response(
        status=200, content_type="application/json",
        body=b'{"choices":[{"message":{"role":"assistant","content":"' + secret.encode()))
    healthy = await start_upstream(name="healthy")
    policy = single_backend_policy(healthy.url, backend="good")
    policy["backends"]["cut"] = {"type": "openai", "url": cut, "models": {"gpt-4o-mini": {}}}
    policy["routes"]["chat"]["targets"] = ["cut/gpt-4o-mini", "good/gpt-4o-mini"]
    traced = await start_traced(policy, otlp_url)

    status, _, _ = await post(traced.gateway.url, CHAT)
    await traced.flush()
    spans = await receiver.wait_for(lambda s: any(x.kind == "SERVER" for x in s))

    assert status == 200
    (failed, _) = sorted((s for s in spans if s.kind == "CLIENT"),
                         key=lambda s: s.attributes["routegate.attempt"])
    assert failed.attributes["error.type"]  # the failure is still named
    assert "7731" not in repr([(s.attributes, s.events) for s in spans])


async def test_a_failed_attempts_span_carries_the_status_the_backend_answered(
    start_upstream: StartUpstream, start_traced: StartTraced,
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, otlp_url = otlp_receiver
    failing = await start_upstream(Behaviour(status=503), name="failing")
    healthy = await start_upstream(name="healthy")
    policy = single_backend_policy(healthy.url, backend="good")
    policy["backends"]["bad"] = {"type": "openai", "url": failing.url,
                                 "models": {"gpt-4o-mini": {}}}
    policy["routes"]["chat"]["targets"] = ["bad/gpt-4o-mini", "good/gpt-4o-mini"]
    traced = await start_traced(policy, otlp_url)

    status, _, _ = await post(traced.gateway.url, CHAT)
    await traced.flush()
    spans = await receiver.wait_for(lambda s: any(x.kind == "SERVER" for x in s))

    assert status == 200
    (failed, answered) = sorted((s for s in spans if s.kind == "CLIENT"),
                                key=lambda s: s.attributes["routegate.attempt"])
    assert failed.attributes["http.response.status_code"] == 503
    assert failed.status_code == 2  # ERROR
    assert answered.attributes["http.response.status_code"] == 200
    assert answered.status_code != 2
