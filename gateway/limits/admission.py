"""The pipeline's `hooks.admission`: estimate, admit, and settle with the actual usage.

Admission reserves `estimated input tokens + expected output` (`max_completion_tokens`
/ `max_tokens`, else the route's `expected_output_tokens`). Settlement replaces it
with what the backend reported in `usage`; a stream cut short (client gone, backend
dropped) that never reported usage is charged its estimated input plus the content
chunks actually relayed (one token each, as OpenAI-compatible servers stream them);
a JSON reply without `usage` is charged what was reserved for it. A request routed to
backends none of which answered (connect errors, timeouts, 5xx, 429s, or the request's
own deadline running out first) is refunded in full, its tokens and the request itself
(RPM); one refused before any backend was chosen (a policy 403, a 400) counts.

Admission hands back what it settles (`Admitted`, holding the limiter's ticket) and
writes into the request record `estimated_input_tokens` and `budget_left_micros`
(routing passes it as `RequestFeatures.tenant_budget_left_micro_usd`). A dedicated
target that answered is charged the amortised price routing decided with
(`RouteDecision.amortised_usd_per_mtok`) instead of the declared prices, and the charge
is the request's cost everywhere (`record.cost_micros`).
"""

from __future__ import annotations

from typing import Any

from gateway.core.context import RequestContext
from gateway.limits.limiter import Limiter, Ticket
from gateway.limits.store import Charge
from routing.cost import charged_micros
from routing.tokens import TokenCounter


def expected_output_tokens(ctx: RequestContext, served: str | None = None) -> int:
    """`served`: the route that serves the request (a tenant's `routes` may differ
    from the model it asked for). `n` choices each produce their own output."""
    return _output_per_choice(ctx, served) * _choices(ctx.body)


def _output_per_choice(ctx: RequestContext, served: str | None) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = ctx.body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    route = ctx.policy.routes.get(ctx.record.requested_model if served is None else served)
    if route is not None:
        return route.expected_output_tokens
    return 0 if ctx.endpoint.name == "embeddings" else 256


def _choices(body: dict[str, Any]) -> int:
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def actual_tokens(ctx: RequestContext) -> tuple[int, int]:
    """(input, output) tokens this request really used, as well as can be known."""
    record = ctx.record
    if record.cache == "hit":
        return 0, 0  # answered from the response cache: no backend used any
    if record.input_tokens is not None or record.output_tokens is not None:
        return record.input_tokens or 0, record.output_tokens or 0  # as the backend said
    estimated = record.estimated_input_tokens or 0
    if not ctx.bytes_sent:
        last = record.attempt
        if last is not None and last.error is None and (last.status or 500) < 300:
            # a JSON reply that did not report usage: what was reserved for it
            return estimated, expected_output_tokens(ctx)
        return 0, 0  # no backend answered (or it failed before streaming): nothing used
    timings = record.timings  # content-bearing events relayed, one token each
    return estimated, timings.tokens_relayed if timings is not None else 0


def unanswered(ctx: RequestContext) -> bool:
    """Routed to backends, and none answered: nothing reached the client from one."""
    if not ctx.candidates or ctx.bytes_sent or ctx.record.cache == "hit":
        return False
    # the pipeline stops at the first attempt that answers: the last one says it
    attempt = ctx.record.attempt
    return attempt is None or attempt.error is not None


class LimitsAdmission:
    def __init__(self, limiter: Limiter, tokens: TokenCounter | None = None) -> None:
        self.limiter = limiter
        self.tokens = tokens or TokenCounter()

    async def admit(self, ctx: RequestContext) -> Admitted:
        identity = ctx.identity
        tenant = identity.tenant
        record = ctx.record
        record.estimated_input_tokens = input_tokens = self.tokens.count_request(ctx.body)
        served = record.served_model
        route = served if served in ctx.policy.routes else None
        ticket = await self.limiter.admit(
            ctx.policy, tenant, tokens=input_tokens + expected_output_tokens(ctx, served),
            key_hash=identity.key_hash, route=route)
        record.budget_left_micros = ticket.remaining_budget_micros
        ctx.response_headers.update(ticket.headers)
        return Admitted(self.limiter, ticket)


class Admitted:
    """One admitted request's ticket, settled once when the request is over."""

    __slots__ = ("limiter", "ticket")

    def __init__(self, limiter: Limiter, ticket: Ticket) -> None:
        self.limiter = limiter
        self.ticket = ticket

    async def settle(self, ctx: RequestContext) -> None:
        ticket = self.ticket
        input_tokens, output_tokens = actual_tokens(ctx)
        cost = 0
        attempt, decision = ctx.attempt, ctx.decision
        if attempt is not None and (input_tokens or output_tokens):
            target = attempt.target
            cost = charged_micros(
                target.backend, target.spec, input_tokens, output_tokens,
                amortised_usd_per_mtok=decision.amortised_usd_per_mtok(target.key)
                if decision is not None else None)
        record = ctx.record
        record.cost_micros = cost
        if record.input_tokens is None and record.output_tokens is None and (
                input_tokens or output_tokens):
            # the backend reported no usage (a stream cut short, a reply without it):
            # what was charged is the request's usage everywhere else too
            record.input_tokens, record.output_tokens = input_tokens, output_tokens
        await self.limiter.settle(ticket, actual_tokens=input_tokens + output_tokens,
                                  charge=Charge(input_tokens, output_tokens, cost,
                                                refund_request=unanswered(ctx)))
