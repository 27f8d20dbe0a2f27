"""What a request costs, in integer micro-dollars: the one cost model.

Shared APIs bill tokens: `usd_per_mtok` is exactly micro-dollars per token. A
dedicated deployment bills hours, whatever it serves; a request's share is the GPU
time it occupies: its prefill, plus its decode divided by the streams that decode
together. Routing predicts a candidate's cost with these (`routing.predict`), and
settlement charges a finished request with `charged_micros` at the price the decision
was based on: the ledger, budgets, spend reports and the request record all hold that
one number.
"""

from __future__ import annotations

from policies.schema import Backend, ModelSpec


def token_cost_micros(input_tokens: int, output_tokens: int, input_usd_per_mtok: float,
                      output_usd_per_mtok: float) -> int:
    """Per-token billing (USD per million tokens is micro-dollars per token)."""
    return round(input_tokens * input_usd_per_mtok + output_tokens * output_usd_per_mtok)


def gpu_cost_micros(gpu_micro_usd_per_ms: float, busy_ms: float) -> int:
    """A share of a GPU billed by the hour: the milliseconds a request occupies it."""
    return round(gpu_micro_usd_per_ms * busy_ms)


def charged_micros(backend: Backend, spec: ModelSpec, input_tokens: int, output_tokens: int,
                   *, amortised_usd_per_mtok: float | None = None) -> int:
    """What a finished request is charged. A dedicated backend charges the amortised
    price routing computed for it (its GPU hour over the tokens it serves, what the
    decision was based on); without a decision, and for shared backends, the declared
    per-token prices."""
    if backend.deployment == "dedicated" and amortised_usd_per_mtok is not None:
        return round((input_tokens + output_tokens) * amortised_usd_per_mtok)
    return token_cost_micros(input_tokens, output_tokens, spec.input_usd_per_mtok,
                             spec.output_usd_per_mtok)
