"""How a decision that leaves no candidate is worded: the rejection's status, code and
message, naming categories and reasons, never request content.

    400  no target the request may use can do what it asks (context window, a capability)
    403  the policy allows no backend for it          429  the tenant's budget is spent
    503  nothing can serve it now (health, ejection, the latency budget)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.capabilities import (
    PARAM,
    REASON,
    REASON_CHOICES,
    REASON_MAX_OUTPUT,
    REASON_PREFIX,
    lowest,
    names_of,
)
from routing.compliance import (
    POLICY_REASONS,
    REASON_CONTEXT_WINDOW,
    REASON_TENANT_BUDGET,
    Excluded,
)
from routing.features import RequestFeatures
from routing.predict import TargetModel


@dataclass(frozen=True, slots=True)
class Rejection:
    # 400 no target can do what it asks, 403 the policy forbids it, 429 budget spent,
    # 503 nothing can serve it now
    status: int
    code: str
    message: str  # names categories and reasons, never request content
    param: str | None = None  # the request field at fault (a 400)


def incapable(model: TargetModel, features: RequestFeatures) -> Excluded:
    missing = features.needs & model.lacks
    if missing:
        return Excluded(model.key, REASON[lowest(missing)],
                        f"the model does not support {', '.join(names_of(missing))}")
    if features.choices > model.max_choices:
        return Excluded(model.key, REASON_CHOICES,
                        f"n={features.choices}; the model gives at most "
                        f"{model.max_choices:.0f} choices")
    return Excluded(model.key, REASON_MAX_OUTPUT,
                    f"max_tokens {features.output_tokens} exceeds the model's "
                    f"{model.max_output_limit:.0f}")


def _is_request_reason(reason: str) -> bool:
    """An exclusion caused by what the request asks for (no target can do it)."""
    return reason == REASON_CONTEXT_WINDOW or reason.startswith(REASON_PREFIX)


def _cannot_do(excluded: Sequence[Excluded], features: RequestFeatures,
               considered: str) -> Rejection:
    """The 400 for a request that no target it may use can serve as written."""
    request = [e for e in excluded if _is_request_reason(e.reason)]
    if all(e.reason == REASON_CONTEXT_WINDOW for e in request):
        tokens = features.input_tokens + features.output_tokens
        return Rejection(400, "context_length_exceeded", (
            f"This request needs about {tokens} tokens ({features.input_tokens} in the "
            f"{features.input_param}, {features.output_tokens} for the completion), more "
            f"than the context window of every model that may serve "
            f"{features.route!r}. Shorten the {features.input_param} or lower max_tokens. "
            f"Considered: {considered}."), features.input_param)
    first = request[0].reason
    capability = first.removeprefix(REASON_PREFIX)
    bit = next((bit for bit, reason in REASON.items() if reason == first), 0)
    param = PARAM.get(bit) or ("n" if first == REASON_CHOICES else "max_tokens")
    return Rejection(400, "unsupported_parameter", (
        f"No model that may serve {features.route!r} supports {capability}, which this "
        f"request needs. Considered: {considered}."), param)


def nothing_fits(excluded: Sequence[Excluded], budget_only: bool,
                  features: RequestFeatures) -> Rejection:
    reasons = "; ".join(f"{e.key}: {e.reason} ({e.detail})" for e in excluded)
    if excluded and not budget_only and \
            any(_is_request_reason(e.reason) for e in excluded) and \
            all(_is_request_reason(e.reason) or e.reason in POLICY_REASONS for e in excluded):
        return _cannot_do(excluded, features, reasons)
    if excluded and all(e.reason == REASON_TENANT_BUDGET for e in excluded):
        return Rejection(429, "budget_exceeded", f"the tenant's budget is spent: {reasons}")
    if budget_only:
        return Rejection(503, "latency_budget_unmeetable",
                         f"no backend can meet the latency budget: {reasons}")
    if excluded and all(e.reason in POLICY_REASONS for e in excluded):
        return Rejection(403, "policy_forbids", f"the policy allows no backend: {reasons}")
    return Rejection(503, "no_backend_available", f"no backend can serve the request: "
                     f"{reasons or 'the route has no enabled targets'}")
