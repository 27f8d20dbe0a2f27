"""Amortised cost of one request on one target, in integer micro-dollars.

Shared APIs bill tokens: `usd_per_mtok` is exactly micro-dollars per token.
A dedicated deployment bills hours, whatever it serves; a request's share is the
GPU time it occupies: its prefill, plus its decode divided by the streams that
decode together (`max_concurrency`). Decode speed comes from live statistics,
from the declared priors before any request has finished.
"""

from __future__ import annotations

from routing.predict import TargetModel


def cost_micro_usd(model: TargetModel, input_tokens: int, output_tokens: int,
                   decode_tokens_per_s: float) -> int:
    if not model.dedicated:
        return round(input_tokens * model.input_micro_usd_per_token
                     + output_tokens * model.output_micro_usd_per_token)
    if not model.gpu_micro_usd_per_ms:
        return 0
    busy_ms = (input_tokens * model.prefill_ms_per_token
               + output_tokens * 1000.0 / (decode_tokens_per_s * (model.slots or 1)))
    return round(model.gpu_micro_usd_per_ms * busy_ms)
