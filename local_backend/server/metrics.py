"""Prometheus metrics with vLLM's names, in a registry owned by one app (no global state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from local_backend.engine.loop import EngineStats

_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                      2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKEN_GAP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                        0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class _EngineCollector(Collector):
    """Gauges read from the engine at scrape time (running, waiting, KV usage, preemptions)."""

    def __init__(self, stats: Callable[[], EngineStats], model: str) -> None:
        self.stats, self.model = stats, model

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        labels = ["model_name"]
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests in the running batch.", s.running),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", s.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache block usage, 0..1.", s.kv_usage),
            ("vllm:gpu_cache_usage_perc", "KV-cache block usage, 0..1 (older name).", s.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric([self.model], value)
            yield gauge
        for name, doc, count in (
            ("vllm:num_preemptions", "Sequences preempted for lack of KV blocks.",
             s.preemptions),
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             s.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
             s.prefix_cache_hits),
        ):
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric([self.model], count)
            yield counter
        yield from self._by_band(s)

    def _by_band(self, s: EngineStats) -> Iterator[Metric]:
        """Per priority band asked for (docs/local-backend.md names them for replica picking)."""
        labels = ["model_name", "band"]
        waiting = GaugeMetricFamily("routegate:num_requests_waiting_by_band",
                                    "Requests waiting to be scheduled, by band.", labels=labels)
        running = GaugeMetricFamily("routegate:num_requests_running_by_band",
                                    "Requests in the running batch, by band.", labels=labels)
        preempted = CounterMetricFamily("routegate:num_preemptions_by_band",
                                        "Sequences preempted, by band.", labels=labels)
        doomed = CounterMetricFamily(
            "routegate:num_requests_doomed_by_band",
            "Requests refused before prefill: they could not finish by their deadline.",
            labels=labels)
        waited = SummaryMetricFamily(
            "routegate:request_queue_time_seconds_by_band",
            "Arrival to first scheduled, by band (count and sum).", labels=labels)
        for band in s.bands:
            key = [self.model, str(band.band)]
            waiting.add_metric(key, band.waiting)
            running.add_metric(key, band.running)
            preempted.add_metric(key, band.preemptions)
            doomed.add_metric(key, band.doomed)
            waited.add_metric(key, band.admitted, band.waited_s)
        yield from (waiting, running, preempted, doomed, waited)


class BackendMetrics:
    def __init__(self, stats: Callable[[], EngineStats], model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(stats, model))
        self.model = model
        kw: dict[str, Any] = {"labelnames": ["model_name"], "registry": self.registry}
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", **kw)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", **kw)
        self.success = Counter(
            "vllm:request_success", "Finished requests by reason.",
            labelnames=["model_name", "finished_reason"], registry=self.registry,
        )

        def hist(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS_S) -> Any:
            return Histogram(name, doc, buckets=buckets, **kw).labels(model)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Arrival to first token.")
        self.itl = hist("vllm:inter_token_latency_seconds", "Gap between tokens.",
                        _TOKEN_GAP_BUCKETS_S)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Decode time per output token.",
                         _TOKEN_GAP_BUCKETS_S)
        self.queue = hist("vllm:request_queue_time_seconds", "Arrival to first scheduled.")
        self.prefill = hist("vllm:request_prefill_time_seconds", "First scheduled to first token.")
        self.decode = hist("vllm:request_decode_time_seconds", "First token to last token.")
        self.inference = hist("vllm:request_inference_time_seconds",
                              "First scheduled to last token.")
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to response end.")

    def observe_request(self, metrics: dict[str, Any], finish_reason: str | None) -> None:
        m = self.model
        self.prompt_tokens.labels(m).inc(metrics["prompt_tokens"])
        self.generation_tokens.labels(m).inc(metrics["completion_tokens"])
        self.success.labels(m, finish_reason or "unknown").inc()
        self.ttft.observe(metrics["ttft_ms"] / 1000)
        self.queue.observe(metrics["queue_ms"] / 1000)
        self.prefill.observe(metrics["prefill_ms"] / 1000)
        self.decode.observe(metrics["decode_ms"] / 1000)
        self.inference.observe(metrics["inference_ms"] / 1000)
        self.e2e.observe(metrics["server_total_ms"] / 1000)
        if metrics["completion_tokens"] > 1:
            self.tpot.observe(metrics["decode_ms"] / 1000 / (metrics["completion_tokens"] - 1))
