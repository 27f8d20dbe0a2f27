"""The routing decision: which targets may serve a request, in which order, and why.

    route targets → hard filters (compliance rules, PII, context window, health,
    tenant budget), each exclusion with a named reason → latency prediction →
    keep those within the latency budget → order by the route's objective (cheapest,
    fastest, or the route's own order) →
    the first is primary, the rest are fallbacks.

`Router` is built once per policy (rebuilt on reload) and caches what depends only on
the route and tenant, so `decide` is arithmetic over a few candidates (`bench/routing.py`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

from policies.capabilities import ModelCapabilities, resolve
from policies.load import ModelTarget, Policy
from routing.capabilities import Learned
from routing.compliance import (
    REASON_CONTEXT_WINDOW,
    REASON_EJECTED,
    REASON_LATENCY_BUDGET,
    REASON_TENANT_BUDGET,
    REASON_UNHEALTHY,
    Excluded,
    ScopedRule,
    partition_by_rules,
    pii_exclusion,
    sole_targets,
)
from routing.features import RequestFeatures, route_for
from routing.predict import TargetModel, estimate
from routing.rejections import Rejection as Rejection
from routing.rejections import incapable, nothing_fits
from routing.spread import Spread, spread_over
from routing.stats import StatsSnapshot

STATIC_CACHE_MAX = 4096  # (route, tenant) pairs; cleared when full, rebuilt on demand


class Candidate(NamedTuple):
    key: str  # "backend/model", also the `x-routegate-route` header value
    target: ModelTarget
    ttft_ms: float  # predicted
    total_ms: float  # predicted
    cost_micro_usd: int  # predicted, amortised
    within_budget: bool
    queue_ms: float  # predicted wait for a slot, part of ttft_ms
    explained_ttft_ms: float  # hand back to LiveStats.record_success


# Made per request: not frozen (a frozen dataclass costs ~3x to build); read-only
# by convention.
@dataclass(slots=True)
class RouteDecision:
    decision_id: str
    route: str
    objective: str
    candidates: tuple[Candidate, ...]  # primary first, then fallbacks
    excluded: tuple[Excluded, ...]
    budget_missed: bool  # nothing fitted the budget; on_budget_miss=fastest chose anyway
    rejection: Rejection | None
    redact: frozenset[str]  # PII categories to replace before the body goes upstream
    features: RequestFeatures
    policy_version: str
    spread: Spread | None = None  # how the primary was chosen among equals

    @property
    def primary(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def candidate(self, key: str) -> Candidate | None:
        for candidate in self.candidates:
            if candidate.key == key:
                return candidate
        return None

    def amortised_usd_per_mtok(self, key: str) -> float | None:
        """What the dedicated candidate `key` costs per token as this decision priced it
        (µUSD per token, i.e. USD per million tokens): what settlement charges it. None
        for a shared target (its declared prices) or one not among the candidates."""
        candidate = self.candidate(key)
        if candidate is None or candidate.target.backend.deployment != "dedicated":
            return None
        features = self.features
        return candidate.cost_micro_usd / max(features.input_tokens + features.output_tokens, 1)

    def to_dict(self) -> dict[str, Any]:
        """The whole decision as JSON-ready data, for spans and `policy explain`."""
        return {
            "decision_id": self.decision_id,
            "route": self.route,
            "objective": self.objective,
            "policy_version": self.policy_version,
            "outcome": "rejected" if self.rejection else "routed",
            "rejection": None if self.rejection is None else {
                "status": self.rejection.status, "code": self.rejection.code,
                "message": self.rejection.message, "param": self.rejection.param},
            "budget_missed": self.budget_missed,
            "redact": sorted(self.redact),
            "features": self.features.to_dict(),
            "candidates": [{
                "target": c.key, "role": "primary" if i == 0 else "fallback",
                "predicted_ttft_ms": round(c.ttft_ms, 1),
                "predicted_total_ms": round(c.total_ms, 1),
                "predicted_queue_ms": round(c.queue_ms, 1),
                "cost_micro_usd": c.cost_micro_usd, "within_budget": c.within_budget,
            } for i, c in enumerate(self.candidates)],
            "excluded": [{"target": e.key, "reason": e.reason, "detail": e.detail}
                         for e in self.excluded],
            "spread": None if self.spread is None else self.spread.to_dict(),
        }


_new_tuple = tuple.__new__
_INF = float("inf")
# Sort keys: Candidate.total_ms and Candidate.cost_micro_usd.
_TOTAL = itemgetter(3)
_COST = itemgetter(4)


class _RoutePlan(NamedTuple):
    objective: str
    reject_on_miss: bool
    models: tuple[TargetModel, ...]
    max_ejected: int  # targets outlier ejection may take out at once; never all of them
    spread_within: float | None  # percent (`routing/spread.py`); None: no spreading
    weights: Mapping[str, float]


def max_ejected(targets: int, percent: float) -> int:
    """`max_ejection_percent` of a route's `targets`, at least one when above 0 (as
    Envoy), and never every target."""
    if targets <= 1 or percent <= 0:
        return 0
    return min(targets - 1, max(1, int(targets * percent / 100.0)))


class Router:
    """Decisions for one policy. Build it when the policy loads, and again when a
    launched backend reports its capabilities (`reported`, by target key) or a backend
    answers it cannot do something (`learned`); not thread-safe (its cache is filled
    from the event loop)."""

    def __init__(self, policy: Policy,
                 reported: Mapping[str, ModelCapabilities] | None = None,
                 learned: Learned | None = None) -> None:
        self.policy = policy
        self._models = {}
        for key, target in policy.targets.items():
            capabilities = resolve(target.backend, target.spec, (reported or {}).get(key))
            lacks = 0
            if learned is not None:
                capabilities, lacks = learned.applied(key, capabilities)
            self._models[key] = TargetModel.of(target, capabilities, lacks)
        self._pii = policy.file.compliance.pii
        route_targets = {name: route.targets for name, route in policy.file.routes.items()}
        self._rules = tuple(ScopedRule.of(rule, route_targets)
                            for rule in policy.file.compliance.rules)
        self._plans: dict[str, _RoutePlan] = {}
        ejection_percent = policy.file.resilience.outlier_detection.max_ejection_percent
        for name in (*policy.routes, *policy.targets):
            route = route_for(policy, name)
            models = tuple(self._models[key] for key in route.targets if key in self._models)
            self._plans[name] = _RoutePlan(
                route.objective, route.on_budget_miss == "reject", models,
                max_ejected(len(models), ejection_percent),
                route.spread.within if route.spread is not None else None, route.weights)
        self._static: dict[tuple[str, str, frozenset[str]],
                           tuple[tuple[TargetModel, ...], tuple[Excluded, ...]]] = {}

    def _allowed(self, features: RequestFeatures, plan: _RoutePlan,
                 ) -> tuple[tuple[TargetModel, ...], tuple[Excluded, ...]]:
        cache_key = (features.route, features.tenant, features.tenant_tags)
        static = self._static.get(cache_key)
        if static is None:
            if len(self._static) >= STATIC_CACHE_MAX:
                self._static.clear()
            static = self._static[cache_key] = partition_by_rules(
                plan.models, self._rules, features.route, features.tenant,
                features.tenant_tags)
        return static

    def sole_targets(self) -> dict[str, list[str]]:
        """Targets that are all a tenant's compliance rules leave it on a route, with
        who ("tenant on route"): ejection keeps them serving (degraded) for that tenant."""
        return sole_targets({route: self._plans[route].models for route in self.policy.routes},
                            self._rules, {name: frozenset(tenant.tags) for name, tenant
                                          in self.policy.file.tenants.items()})

    def decide(self, features: RequestFeatures, stats: StatsSnapshot, now: float,
               decision_id: str | None = None,
               draws: tuple[float, float] = (0.0, 0.0)) -> RouteDecision:
        """`draws`: two uniform numbers in [0, 1) for a route's `spread` (routing has no
        random source of its own, so a decision is a function of its inputs)."""
        decision_id = decision_id or secrets.token_hex(8)
        plan = self._plans.get(features.route)
        if plan is None:
            return self._reject(decision_id, features, "", (), Rejection(
                404, "model_not_found", f"the model {features.route!r} does not exist"))
        if features.pii and self._pii.action == "block":
            return self._reject(decision_id, features, plan.objective, (), Rejection(
                403, "pii_blocked",
                f"the request contains {', '.join(sorted(features.pii))}, "
                "which this gateway's policy does not allow to be sent"))

        allowed, static_excluded = self._allowed(features, plan)
        excluded = list(static_excluded)
        if stats.ejected:
            allowed = _without_ejected(allowed, stats.ejected, now, plan.max_ejected, excluded)
        fitting: list[Candidate] = []
        missing: list[Candidate] = []
        unaffordable: list[Candidate] = []  # more than the tenant's budget has left
        inputs, outputs = features.input_tokens, features.output_tokens
        tokens = inputs + outputs
        # None (no limit) as infinity: one comparison per candidate instead of two.
        ttft_budget, total_budget = features.ttft_budget_ms, features.total_budget_ms
        ttft_limit = _INF if ttft_budget is None else ttft_budget
        total_limit = _INF if total_budget is None else total_budget
        budget_left = features.tenant_budget_left_micro_usd
        cost_limit = _INF if budget_left is None else budget_left
        targets = stats.targets
        empty = stats.target("")
        pii = features.pii
        needs, choices = features.needs, features.choices
        asked_output = outputs if features.output_tokens_source == "request" else 0
        new_tuple, candidate_type = _new_tuple, Candidate
        for model in allowed:
            if pii:
                pii_excluded = pii_exclusion(self._pii, pii, model)
                if pii_excluded is not None:
                    excluded.append(pii_excluded)
                    continue
            if needs & model.lacks or choices > model.max_choices or \
                    asked_output > model.max_output_limit:
                excluded.append(incapable(model, features))
                continue
            if tokens > model.context_limit:
                excluded.append(Excluded(
                    model.key, REASON_CONTEXT_WINDOW,
                    f"{inputs} input + {outputs} output tokens exceed the "
                    f"{model.context_tokens}-token context window"))
                continue
            snapshot = targets.get(model.key, empty)
            if snapshot.unhealthy_until is not None and now < snapshot.unhealthy_until:
                excluded.append(Excluded(model.key, REASON_UNHEALTHY,
                                         "failing its backend's active health checks"))
                continue
            prefilled = inputs
            if features.cached_share is not None:  # a fleet replica likely holds part
                prefilled = round(inputs * (1.0 - features.cached_share.get(model.key, 0.0)))
            ttft, total, queue, explained, cost = estimate(
                model, prefilled, outputs, snapshot, now)
            within = ttft <= ttft_limit and total <= total_limit
            # tuple.__new__ skips NamedTuple's Python-level __new__: a third of the
            # per-candidate cost with 100 candidates.
            candidate = new_tuple(candidate_type, (model.key, model.target, ttft, total, cost,
                                                   within, queue, explained))
            if cost > cost_limit:
                unaffordable.append(candidate)
            else:
                (fitting if within else missing).append(candidate)

        if unaffordable:
            if budget_left is not None and budget_left > 0 and not fitting and not missing:
                # Budgets are post-paid (the limiter refuses once they are spent): while
                # some is left, a request nothing can cover in full still runs.
                fitting = [c for c in unaffordable if c.within_budget]
                missing = [c for c in unaffordable if not c.within_budget]
            else:
                excluded.extend(Excluded(
                    c.key, REASON_TENANT_BUDGET,
                    f"predicted cost {c.cost_micro_usd} µUSD exceeds the "
                    f"{max(budget_left or 0, 0)} µUSD left") for c in unaffordable)

        redact = features.pii if self._pii.action == "redact" else frozenset()
        budget_missed = False
        if fitting:
            objective = plan.objective
            candidates = _ordered(fitting, objective)
            excluded.extend(_over_budget(missing, features))
        elif missing and not plan.reject_on_miss:
            objective = "fastest"
            candidates = _ordered(missing, objective)
            budget_missed = True
        else:
            excluded.extend(_over_budget(missing, features))
            return self._reject(decision_id, features, plan.objective, excluded,
                                nothing_fits(excluded, bool(missing), features), redact)
        spread = None
        if plan.spread_within is not None and len(candidates) > 1:
            spread = spread_over(candidates, objective, plan.spread_within, plan.weights,
                                 stats, draws)
        return RouteDecision(decision_id, features.route, plan.objective, tuple(candidates),
                             tuple(excluded), budget_missed, None, redact, features,
                             self.policy.version_hash, spread)

    def _reject(self, decision_id: str, features: RequestFeatures, objective: str,
                excluded: Sequence[Excluded], rejection: Rejection,
                redact: frozenset[str] = frozenset()) -> RouteDecision:
        return RouteDecision(decision_id, features.route, objective, (), tuple(excluded),
                             False, rejection, redact, features, self.policy.version_hash)


def decide(features: RequestFeatures, policy: Policy, stats: StatsSnapshot, now: float,
           decision_id: str | None = None) -> RouteDecision:
    """One-off decision. Builds a `Router` each call: the hot path keeps one instead."""
    return Router(policy).decide(features, stats, now, decision_id)


def _without_ejected(allowed: tuple[TargetModel, ...], ejected: Mapping[str, float],
                     now: float, cap: int, excluded: list[Excluded]) -> tuple[TargetModel, ...]:
    """`allowed` less its ejected targets, at most `cap` of them (those out the longest
    first); the rest serve as if in service (degraded), so a bad minute never empties a
    route, nor what a tenant's compliance rules leave it: its last target stays (only
    failing health checks take that out, as `backend_unhealthy`)."""
    out = [model for model in allowed if ejected.get(model.key, now) > now]
    if not out:
        return allowed
    cap = min(cap, len(allowed) - 1)
    if cap <= 0:
        return allowed
    out.sort(key=lambda model: ejected[model.key], reverse=True)
    gone = {model.key for model in out[:cap]}
    excluded.extend(Excluded(
        model.key, REASON_EJECTED,
        f"ejected after failures in a row, for {ejected[model.key] - now:.1f} s more")
        for model in out[:cap])
    return tuple(model for model in allowed if model.key not in gone)


def _ordered(candidates: list[Candidate], objective: str) -> list[Candidate]:
    if objective == "ordered":  # already in the route's declared order
        return candidates
    # Ties go to the next criterion, then to the route's declared target order
    # (list.sort is stable), so a decision is a function of its inputs.
    # Two stable sorts on single fields: cheaper than one sort on a tuple key.
    first, then = (_COST, _TOTAL) if objective == "fastest" else (_TOTAL, _COST)
    candidates.sort(key=first)
    candidates.sort(key=then)
    return candidates


def _over_budget(missing: list[Candidate], features: RequestFeatures) -> list[Excluded]:
    out = []
    for c in missing:
        if features.ttft_budget_ms is not None and c.ttft_ms > features.ttft_budget_ms:
            detail = f"predicted TTFT {c.ttft_ms:.0f} ms > budget {features.ttft_budget_ms:.0f} ms"
        else:
            detail = (f"predicted total {c.total_ms:.0f} ms > "
                      f"budget {features.total_budget_ms or 0:.0f} ms")
        out.append(Excluded(c.key, REASON_LATENCY_BUDGET, detail))
    return out
