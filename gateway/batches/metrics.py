"""Batch metrics, in the gateway's registry: where batch lines ran, what they cost and
what the same tokens would have cost on shared targets. Labels are small fixed sets
(placement, outcome, status), never a batch id; each line's own request record feeds
the per-request metrics, access log and spans as any request's does."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.batches.model import LineResult
from gateway.telemetry.metric_series import CounterFamily

PREFIX = "routegate_batch"


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lines = CounterFamily(
            f"{PREFIX}_lines_total", "Batch lines finished, by where they ran (dedicated, "
            "shared, none: never sent) and outcome (ok, error).", ("placement", "outcome"),
            registry=registry)
        self.tokens = CounterFamily(
            f"{PREFIX}_tokens_total", "Tokens of batch lines, by where they ran and kind "
            "(input, output).", ("placement", "kind"), registry=registry)
        self.cost = CounterFamily(
            f"{PREFIX}_cost_micros_total", "The ledger's cost of batch lines in micro-dollars "
            "(dedicated lines at their amortised GPU-hour price).", ("placement",),
            registry=registry)
        self.all_shared = CounterFamily(
            f"{PREFIX}_all_shared_cost_micros_total", "What the same batch lines would have "
            "cost on their route's cheapest shared target, in micro-dollars.",
            registry=registry)
        self.finished = CounterFamily(
            f"{PREFIX}es_finished_total", "Batches that reached a final status.", ("status",),
            registry=registry)

    def line(self, result: LineResult) -> None:
        placement = result.placement or "none"
        self.lines.labels(placement, "ok" if result.ok else "error").inc()
        if result.placement is None:
            return
        self.tokens.labels(placement, "input").inc(result.input_tokens)
        self.tokens.labels(placement, "output").inc(result.output_tokens)
        self.cost.labels(placement).inc(result.cost_micros)
        self.all_shared.labels().inc(result.all_shared_cost_micros)

    def batch_finished(self, status: str) -> None:
        self.finished.labels(status).inc()
