"""What `bench/backfill.py` reads from /metrics during its trace, and how it prints it:
the engine's samples by band, the gateway's queue waits by priority, and the engine's
running requests sampled over time."""

from __future__ import annotations

import asyncio
from contextlib import suppress

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

SAMPLE_EVERY_S = 0.25  # the engine's /metrics, read during the trace


async def engine_metrics(session: aiohttp.ClientSession, local_url: str) -> dict[str, float]:
    """The engine's samples, by `name{band}` (bands apart, models summed)."""
    async with session.get(local_url.removesuffix("/v1") + "/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            band = sample.labels.get("band")
            key = sample.name if band is None else f"{sample.name}{{{band}}}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


async def gateway_queue(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    """The gateway's queue waits for the dedicated backend, summed by priority
    (`{priority}_count`, `{priority}_sum`)."""
    async with session.get(base_url.removesuffix("/v1") + "/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "routegate_queue_wait_seconds":
            continue
        for sample in family.samples:
            kind = sample.name.rsplit("_", 1)[1]
            if kind in ("count", "sum") and sample.labels.get("backend") == "local":
                key = f"{sample.labels['priority']}_{kind}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


async def sample_running(local_url: str, stop: asyncio.Event) -> list[float]:
    running: list[float] = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            running.append((await engine_metrics(session, local_url)).get(
                "vllm:num_requests_running", 0.0))
            with suppress(TimeoutError):
                async with asyncio.timeout(SAMPLE_EVERY_S):
                    await stop.wait()
    return running


def by_band(engine: dict[str, float]) -> str:
    """Mean engine queue wait and preemptions per band asked for, during the trace."""
    parts = []
    for band in sorted({key.rsplit("{", 1)[1].rstrip("}") for key in engine if "{" in key}):
        count = engine.get(f"routegate:request_queue_time_seconds_by_band_count{{{band}}}", 0)
        waited = engine.get(f"routegate:request_queue_time_seconds_by_band_sum{{{band}}}", 0)
        preempted = engine.get(f"routegate:num_preemptions_by_band_total{{{band}}}", 0)
        if count:
            parts.append(f"band {band}: {count:.0f} admitted, mean wait "
                         f"{waited / count * 1000:.1f} ms, {preempted:.0f} preempted")
    return "; ".join(parts) or "none"


def queued(waits: dict[str, float]) -> str:
    """Mean wait for a gateway slot per priority, during the trace."""
    parts = []
    for priority in sorted({key.rsplit("_", 1)[0] for key in waits}):
        count = waits.get(f"{priority}_count", 0.0)
        if count:
            parts.append(f"{priority}: {count:.0f} requests, mean wait "
                         f"{waits.get(f'{priority}_sum', 0.0) / count * 1000:.1f} ms")
    return "; ".join(parts) or "none"
