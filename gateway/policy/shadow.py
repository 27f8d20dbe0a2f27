"""Shadow mode: decide every request under a candidate policy too, and count differences.

`routegate serve --shadow-policy FILE` runs a second policy beside the live one.
After each request has been answered (so it can never delay or change one), the
same request is decided again under the candidate with the same `routing.Router`
code, and the two outcomes are compared: the primary target, or the rejection
code. Differences are counted (`routegate_policy_shadow_decisions_total{result}`)
and the latest ones kept, without any request content, for `/admin/policy/shadow`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from gateway.core.attempt_facts import Attempt
from gateway.core.context import RequestContext
from policies.load import Policy
from routing.decide import RouteDecision, Router
from routing.features import (
    TOTAL_BUDGET_HEADER,
    TTFT_BUDGET_HEADER,
    FeatureError,
    RequestFeatures,
    build_features,
    route_for,
    tightened,
)
from routing.pii import PiiScanner
from routing.stats import StatsSnapshot
from routing.tokens import TokenCounter

log = logging.getLogger("routegate.policy.shadow")

SAMPLE_SIZE = 50  # differing decisions kept for the admin endpoint (bounded memory)


def outcome(decision: RouteDecision) -> str:
    """What a decision amounts to for the client: where it goes, or why not."""
    if decision.rejection is not None:
        return f"rejected:{decision.rejection.code}"
    primary = decision.primary
    return primary.key if primary is not None else "rejected:no_candidates"


def _summary(decision: RouteDecision) -> dict[str, Any]:
    data = decision.to_dict()
    return {"outcome": outcome(decision), "policy_version": decision.policy_version,
            "candidates": [c["target"] for c in data["candidates"]],
            "excluded": data["excluded"], "budget_missed": decision.budget_missed}


class ShadowPolicy:
    """An observer (`hooks.observers`) that decides each finished request again."""

    def __init__(self, policy: Policy, *, tokens: TokenCounter,
                 registry: CollectorRegistry | None = None,
                 stats: Callable[[], StatsSnapshot] = StatsSnapshot,
                 clock: Callable[[], float] | None = None,
                 sample_size: int = SAMPLE_SIZE) -> None:
        self.policy = policy
        self._router = Router(policy)
        self._tokens = tokens
        self._stats = stats
        # The live router's clock (monotonic), so both read the same stats alike.
        self._clock = clock or time.monotonic
        self._scanner = PiiScanner(policy.file.compliance.pii.detect)
        self._live_router: Router | None = None
        self._live_scanner: PiiScanner | None = None
        self.decisions = Counter(
            "policy_shadow_decisions", "Requests decided again under the shadow policy "
            "(result = same | different).", ["result"], namespace="routegate",
            registry=registry or CollectorRegistry())
        self.same = 0
        self.different = 0
        self.samples: deque[dict[str, Any]] = deque(maxlen=sample_size)
        self._failures_logged: set[str] = set()

    # Observer protocol -----------------------------------------------------------------
    def request_started(self, ctx: RequestContext) -> None:
        return None

    def attempt_finished(self, ctx: RequestContext, attempt: Attempt) -> None:
        return None

    def request_finished(self, ctx: RequestContext) -> None:
        if not ctx.record.requested_model or not ctx.body:
            return  # refused before it was parsed: nothing to decide
        try:
            self.compare(ctx)
        except Exception as exc:  # a shadow must never fail a request; log each kind once
            kind = type(exc).__name__
            if kind not in self._failures_logged:
                self._failures_logged.add(kind)
                log.exception("shadow policy evaluation failed")

    # -------------------------------------------------------------------------------------
    def compare(self, ctx: RequestContext) -> tuple[RouteDecision, RouteDecision] | None:
        now = self._clock()
        stats = self._stats()
        live = ctx.decision if isinstance(ctx.decision, RouteDecision) else None
        if live is None:
            try:
                features = build_features(ctx.body, ctx.request.headers, ctx.policy,
                                          ctx.identity.tenant, tokens=self._tokens,
                                          pii=self._live_pii(ctx.policy), stats=stats)
            except FeatureError:
                return None  # the live gateway answered 400; so would the shadow
            live = self._live(ctx.policy).decide(features, stats, now, "live")
        shadow = self._router.decide(self.features_for(live.features, ctx, stats), stats, now,
                                     "shadow")
        if outcome(live) == outcome(shadow):
            self.same += 1
            self.decisions.labels("same").inc()
        else:
            self.different += 1
            self.decisions.labels("different").inc()
            self.samples.append({
                "at": time.time(), "request_id": ctx.record.request_id, "route": live.route,
                "tenant": live.features.tenant, "live": _summary(live),
                "shadow": _summary(shadow)})
        return live, shadow

    def features_for(self, live: RequestFeatures, ctx: RequestContext,
                     stats: StatsSnapshot | None = None) -> RequestFeatures:
        """The live request's features as the shadow policy sees them: the route its tenant
        overrides send the asked-for model to, its tenant tags and priority, its route's
        latency budget and expected output, its PII categories. Tokens are not counted
        twice."""
        tenant = self.policy.file.tenants.get(live.tenant)
        # The asked-for model, not the live route: the candidate's own tenant `routes`
        # overrides decide where it goes (an unknown name: the decision says so).
        model = ctx.record.requested_model
        route_name = self.policy.resolve_model(model, live.tenant) or model or live.route
        output_tokens = live.output_tokens
        try:
            route = route_for(self.policy, route_name)
            if route_name != live.route and live.output_tokens_source != "request":
                mean = stats.output_tokens_mean.get(route_name) if stats else None
                output_tokens = (max(1, round(mean)) if mean is not None
                                 else route.expected_output_tokens)
            budget = route.latency_budget
            ttft = tightened(budget.ttft_ms, ctx.request.headers.get(TTFT_BUDGET_HEADER),
                             TTFT_BUDGET_HEADER)
            total = tightened(budget.total_ms, ctx.request.headers.get(TOTAL_BUDGET_HEADER),
                              TOTAL_BUDGET_HEADER)
        except FeatureError:
            ttft = total = None  # the route does not exist there: the decision says so
        pii = live.pii
        if self._scanner.categories != frozenset(ctx.policy.file.compliance.pii.detect):
            pii = self._scanner.categories_in(ctx.body)  # scanned again only when they differ
        return dataclasses.replace(
            live, route=route_name, output_tokens=output_tokens,
            tenant_tags=frozenset(tenant.tags) if tenant else frozenset(),
            priority=tenant.priority if tenant else self.policy.file.defaults.priority,
            ttft_budget_ms=ttft, total_budget_ms=total, pii=pii)

    def _live(self, policy: Policy) -> Router:
        if self._live_router is None or self._live_router.policy is not policy:
            self._live_router = Router(policy)
        return self._live_router

    def _live_pii(self, policy: Policy) -> PiiScanner:
        detect = frozenset(policy.file.compliance.pii.detect)
        if self._live_scanner is None or self._live_scanner.categories != detect:
            self._live_scanner = PiiScanner(detect)
        return self._live_scanner

    def report(self) -> dict[str, Any]:
        total = self.same + self.different
        return {"shadow_version": self.policy.version_hash, "source": self.policy.source,
                "decisions": total, "same": self.same, "different": self.different,
                "different_ratio": round(self.different / total, 4) if total else 0.0,
                "samples": list(reversed(self.samples))}
