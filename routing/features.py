"""What routing needs to know about one request, computed once from the parsed body."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from policies.load import Policy
from policies.schema import Route
from routing.capabilities import choices_of, names_of, needs_of
from routing.pii import PiiScanner
from routing.stats import StatsSnapshot
from routing.tokens import TokenCounter

TTFT_BUDGET_HEADER = "x-routegate-ttft-budget-ms"
TOTAL_BUDGET_HEADER = "x-routegate-total-budget-ms"
# A route asked for by a target key ("local/llama") has no route settings of its own.
DIRECT_ROUTE = Route(targets=["direct/target"])

OutputSource = Literal["request", "route_mean", "route_default"]


class FeatureError(ValueError):
    """The request cannot be routed as written (the gateway answers 400)."""

    def __init__(self, message: str, *, param: str | None = None,
                 not_found: bool = False) -> None:
        super().__init__(message)
        self.param = param
        self.not_found = not_found  # the model does not exist for this caller (404)


# Made per request: not frozen (a frozen dataclass costs ~3x to build); read-only
# by convention.
@dataclass(slots=True)
class RequestFeatures:
    route: str  # a route name, or a target key the client named directly
    tenant: str
    tenant_tags: frozenset[str]
    priority: str  # high | normal | low (a tenant's; the Batch API's lines queue as batch)
    input_tokens: int
    output_tokens: int
    output_tokens_source: OutputSource
    stream: bool
    pii: frozenset[str]  # categories found, never the text
    ttft_budget_ms: float | None
    total_budget_ms: float | None
    tenant_budget_left_micro_usd: int | None = None  # None: no budget, or not tracked
    needs: int = 0  # capability bits (routing.capabilities) the body asks for
    choices: int = 1  # `n`
    input_param: str = "messages"  # the body field that holds the prompt
    # target key → share (0..1) of the prompt its best replica likely holds in its prefix
    # cache (a fleet's index); that part is not prefilled again. None: nothing known
    cached_share: Mapping[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        held = {} if self.cached_share is None else {
            "cached_share": {key: round(share, 3) for key, share in self.cached_share.items()}}
        return {**held,
            "route": self.route, "tenant": self.tenant, "tenant_tags": sorted(self.tenant_tags),
            "priority": self.priority, "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "output_tokens_source": self.output_tokens_source, "stream": self.stream,
            "pii": sorted(self.pii), "ttft_budget_ms": self.ttft_budget_ms,
            "total_budget_ms": self.total_budget_ms,
            "tenant_budget_left_micro_usd": self.tenant_budget_left_micro_usd,
            "needs": names_of(self.needs) + (["n"] if self.choices > 1 else []),
        }


def tightened(route_budget_ms: float | None, header_value: str | None,
              header: str) -> float | None:
    """The route's budget, made tighter (never looser) by a request header."""
    if header_value is None or header_value.strip() == "":
        return route_budget_ms
    try:
        requested = float(header_value)
    except ValueError:
        requested = math.nan
    if not math.isfinite(requested) or requested <= 0:
        raise FeatureError(f"{header} must be a positive number of milliseconds", param=header)
    return requested if route_budget_ms is None else min(route_budget_ms, requested)


def route_for(policy: Policy, route_name: str) -> Route:
    route = policy.routes.get(route_name)
    if route is not None:
        return route
    if route_name in policy.targets:
        return DIRECT_ROUTE.model_copy(update={"targets": [route_name]})
    raise FeatureError(f"the model {route_name!r} does not exist", param="model")


def build_features(body: Mapping[str, Any], headers: Mapping[str, str], policy: Policy,
                   tenant: str, *, tokens: TokenCounter, pii: PiiScanner | None = None,
                   stats: StatsSnapshot | None = None,
                   tenant_budget_left_micro_usd: int | None = None,
                   input_tokens: int | None = None,
                   key_hash: str | None = None) -> RequestFeatures:
    """Features of a parsed OpenAI request body. `headers` must look names up
    case-insensitively (aiohttp's `CIMultiDict` does). `input_tokens`: a count already
    made for this body (the rate limiter's), so it is not made twice. `key_hash`: the
    caller's key, whose own access may differ from its tenant's."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise FeatureError("`model` is required", param="model")
    route_name = policy.resolve_model(model, tenant)
    if route_name is None or not policy.access_of(tenant, key_hash).allows(model):
        raise FeatureError(f"the model {model!r} does not exist", param="model",
                           not_found=True)
    route = route_for(policy, route_name)

    output_tokens, source = _output_tokens(body, route_name, route, stats)
    tenant_spec = policy.file.tenants.get(tenant)
    tags = frozenset(tenant_spec.tags) if tenant_spec else frozenset()
    priority = tenant_spec.priority if tenant_spec else policy.file.defaults.priority
    return RequestFeatures(
        route=route_name,
        tenant=tenant,
        tenant_tags=tags,
        priority=priority,
        input_tokens=tokens.count_request(body) if input_tokens is None else input_tokens,
        output_tokens=output_tokens,
        output_tokens_source=source,
        stream=body.get("stream") is True,
        pii=pii.categories_in(body) if pii is not None else frozenset(),
        ttft_budget_ms=tightened(route.latency_budget.ttft_ms,
                                 headers.get(TTFT_BUDGET_HEADER), TTFT_BUDGET_HEADER),
        total_budget_ms=tightened(route.latency_budget.total_ms,
                                  headers.get(TOTAL_BUDGET_HEADER), TOTAL_BUDGET_HEADER),
        tenant_budget_left_micro_usd=tenant_budget_left_micro_usd,
        needs=needs_of(body),
        choices=choices_of(body),
        input_param="messages" if "messages" in body else
        "prompt" if "prompt" in body else "input",
    )


def _output_tokens(body: Mapping[str, Any], route_name: str, route: Route,
                   stats: StatsSnapshot | None) -> tuple[int, OutputSource]:
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise FeatureError(f"`{field}` must be a positive integer", param=field)
        return value, "request"
    if stats is not None:
        mean = stats.output_tokens_mean.get(route_name)
        if mean is not None:
            return max(1, round(mean)), "route_mean"
    return route.expected_output_tokens, "route_default"
