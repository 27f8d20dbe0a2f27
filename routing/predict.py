"""Latency prediction for one request on one target, from live stats or declared priors.

    TTFT  ≈ network + queue wait + fixed overhead + input tokens / prefill rate
    total ≈ TTFT + output tokens / decode rate

Queue wait models a backend that serves `max_concurrency` requests at once (a
model with a `max_concurrency` of its own, the tighter of the two): a
request waits when that many are already running (as counted by the gateway,
or as reported by the backend's own `/metrics`, plus the gateway's own requests still
queued for it), for the requests ahead of it to free a slot, each taking about one mean
service time spread over the slots. A target whose last 429 carried a `Retry-After`
waits at least until then.
A target with no `max_concurrency` (a shared API) only waits in the gateway's
own queue. All times are milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from policies.capabilities import ModelCapabilities, resolve
from policies.load import ModelTarget
from routing.capabilities import ALL, mask_of
from routing.cost import gpu_cost_micros, token_cost_micros
from routing.stats import LOAD_FRESH_S, TargetSnapshot

KV_CACHE_FULL = 0.95  # above this use a new request cannot start until one finishes


@dataclass(frozen=True, slots=True)
class TargetModel:
    """Per-target constants, resolved once per policy so that prediction is arithmetic."""

    key: str
    target: ModelTarget
    dedicated: bool
    slots: int | None  # the backend's max_concurrency: requests its GPU runs at once
    queue_slots: int | None  # the tighter of that and the model's own: when this target queues
    prior_network_ms: float
    prior_overhead_ms: float
    prefill_ms_per_token: float
    prior_decode_tokens_per_s: float
    context_tokens: int | None
    context_limit: float  # context_tokens, or infinity when not declared
    lacks: int  # capability bits (routing.capabilities) it does not have
    max_choices: float  # `n`, or infinity
    max_output_limit: float  # max_output_tokens, or infinity
    # Cost constants (routing/cost.py): micro-dollars per token, per GPU-millisecond.
    input_micro_usd_per_token: float
    output_micro_usd_per_token: float
    gpu_micro_usd_per_ms: float

    @classmethod
    def of(cls, target: ModelTarget, capabilities: ModelCapabilities | None = None,
           lacks: int = 0) -> TargetModel:
        """`capabilities`: as resolved with what the backend reported (default: as the
        policy declares them); `lacks`: bits learned missing on top."""
        priors = target.spec.priors
        can = capabilities or resolve(target.backend, target.spec)
        # What the backend measured on itself (a launched backend, after its warm-up)
        # beats what the policy guessed for it.
        prefill_rate = can.prefill_tokens_per_s or priors.prefill_tokens_per_s
        decode_rate = can.decode_tokens_per_s or priors.decode_tokens_per_s
        inf = float("inf")
        return cls(
            key=target.key, target=target,
            dedicated=target.backend.deployment == "dedicated",
            slots=target.backend.max_concurrency,
            queue_slots=_tighter(target.spec.max_concurrency, target.backend.max_concurrency),
            prior_network_ms=priors.network_ms,
            prior_overhead_ms=priors.ttft_ms or 0.0,
            prefill_ms_per_token=1000.0 / prefill_rate,
            prior_decode_tokens_per_s=decode_rate,
            context_tokens=can.context_tokens,
            context_limit=can.context_tokens or inf,
            lacks=(ALL & ~mask_of(can)) | lacks,
            max_choices=inf if can.n is None else can.n,
            max_output_limit=can.max_output_tokens or inf,
            input_micro_usd_per_token=target.spec.input_usd_per_mtok,
            output_micro_usd_per_token=target.spec.output_usd_per_mtok,
            # USD/hour × 1e6 µUSD/USD ÷ 3.6e6 ms/hour
            gpu_micro_usd_per_ms=(target.backend.gpu_hour_usd or 0.0) / 3.6,
        )


class Prediction(NamedTuple):
    ttft_ms: float
    total_ms: float
    queue_ms: float
    explained_ttft_ms: float  # network + queue + prefill: the part not learnt as overhead
    decode_tokens_per_s: float
    measured: bool  # False while the target runs on its declared priors


def estimate(model: TargetModel, input_tokens: int, output_tokens: int,
             stats: TargetSnapshot, now: float) -> tuple[float, float, float, float, int]:
    """(ttft_ms, total_ms, queue_ms, explained_ttft_ms, cost_micro_usd) as a plain tuple:
    `decide` calls this for every candidate, and a tuple is the cheapest result. The
    cost is the cost model's (`routing.cost`), from the terms already at hand here."""
    network = model.prior_network_ms if stats.network_ms is None else stats.network_ms
    overhead = model.prior_overhead_ms if stats.overhead_ms is None else stats.overhead_ms
    decode = stats.decode_tokens_per_s or model.prior_decode_tokens_per_s
    prefill = input_tokens * model.prefill_ms_per_token
    decode_ms = output_tokens * 1000.0 / decode
    slots, queue_slots = model.slots, model.queue_slots
    # Requests that must finish before this one starts (the counts are this target's).
    if queue_slots is not None:
        ahead = stats.in_flight + stats.queue_depth - queue_slots + 1
        if ahead < 0:
            ahead = 0
    else:
        ahead = stats.queue_depth
    if stats.load_at is not None and now - stats.load_at <= LOAD_FRESH_S:
        # The backend's own view also counts other gateway replicas' requests.
        reported = stats.backend_waiting or 0
        if slots is not None and (stats.backend_running or 0) >= slots:
            reported += 1
        if stats.kv_cache_use is not None and stats.kv_cache_use >= KV_CACHE_FULL:
            reported = max(reported, 1)
        ahead = max(ahead, reported + stats.queue_depth)
    queue = 0.0
    if ahead:
        service = stats.service_ms if stats.service_ms is not None else (
            overhead + prefill + decode_ms)
        queue = ahead * service / (queue_slots or 1)
    busy_until = stats.retry_after_until
    if busy_until is not None and busy_until > now:
        # its last 429 asked to be left alone this long: a wait, not a fault
        queue = max(queue, (busy_until - now) * 1000.0)
    explained = network + queue + prefill
    ttft = explained + overhead
    cost = predicted_cost_micros(model, input_tokens, output_tokens, decode)
    return ttft, ttft + decode_ms, queue, explained, cost


def predicted_cost_micros(model: TargetModel, input_tokens: int, output_tokens: int,
                          decode_tokens_per_s: float) -> int:
    """The cost model (`routing.cost`) for one candidate: its tokens at a shared API's
    prices, or a dedicated GPU's time: the prefill, plus the decode shared by the
    streams that decode together."""
    if not model.dedicated:
        return token_cost_micros(input_tokens, output_tokens, model.input_micro_usd_per_token,
                                 model.output_micro_usd_per_token)
    busy_ms = (input_tokens * model.prefill_ms_per_token
               + output_tokens * 1000.0 / (decode_tokens_per_s * (model.slots or 1)))
    return gpu_cost_micros(model.gpu_micro_usd_per_ms, busy_ms)


def predict(model: TargetModel, input_tokens: int, output_tokens: int,
            stats: TargetSnapshot, now: float) -> Prediction:
    ttft, total, queue, explained, _ = estimate(model, input_tokens, output_tokens, stats, now)
    decode = stats.decode_tokens_per_s or model.prior_decode_tokens_per_s
    return Prediction(ttft, total, queue, explained, decode, measured=stats.samples > 0)


def _tighter(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)
