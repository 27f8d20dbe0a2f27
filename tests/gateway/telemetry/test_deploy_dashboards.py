"""The shipped Grafana dashboard and collector config match what the gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.cache.metrics import CacheCollector
from gateway.cache.response_cache import ResponseCache
from gateway.stores.blobs import MemoryBlobs
from gateway.telemetry.service import Telemetry
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import scripted_request

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
SERIES = re.compile(r"\b(routegate_[a-z_]+)")


async def exported_series() -> set[str]:
    """Every sample name /metrics exposes after a little traffic."""
    clock = FakeClock()
    telemetry = Telemetry(clock=clock)
    await scripted_request(telemetry, clock)
    telemetry.metrics.observe_rejection("acme", "rpm")
    telemetry.metrics.observe_shed("local", "normal")
    telemetry.metrics.observe_fallback("chat", "a", "b")
    telemetry.metrics.observe_prediction_error("a", "m", ttft_ms=-20.0, total_ms=150.0)
    telemetry.metrics.policy_reloads.labels("ok").inc()
    cache = ResponseCache(MemoryBlobs(max_bytes=1024))
    cache.counts["chat"].hits += 1
    telemetry.metrics.registry.register(CacheCollector(cache))
    text = telemetry.metrics.render()[0].decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "routegate.json").read_text())


async def test_every_grafana_query_names_a_series_the_gateway_exports() -> None:
    exported = await exported_series()
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]
    used = {name for expr in exprs for name in SERIES.findall(expr)}
    assert used and used <= exported, sorted(used - exported)


def test_grafana_dashboard_has_the_panels_of_the_live_page() -> None:
    titles = " | ".join(p["title"].lower() for p in dashboard()["panels"])
    for topic in ("inference", "queue wait", "first token", "routing share", "reason",
                  "spend", "rejections", "requests per second", "response cache"):
        assert topic in titles, topic


def test_grafana_panels_do_not_overlap() -> None:
    cells = set()
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))


def test_collector_receives_otlp_over_http_and_grpc_and_exports_traces() -> None:
    config = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text())
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["http"]["endpoint"].endswith(":4318")
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    pipeline = config["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"]
    for name in pipeline["processors"] + pipeline["exporters"]:
        section = "processors" if name in pipeline["processors"] else "exporters"
        assert name in config[section], name
    assert "batch" in pipeline["processors"]
