"""Compliance filters: which targets a tenant's request may reach, and why not.

Fail-closed: a rule that needs a fact the policy does not state about a backend
(its region, its data retention) excludes that backend, naming the missing fact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Final, NamedTuple

from policies.schema import ComplianceRule, PiiPolicy
from routing.predict import TargetModel

# Every reason a candidate can be excluded for, by name (spans, metrics, explain).
REASON_COMPLIANCE_RULE: Final = "compliance_rule"
REASON_REGION: Final = "region"
REASON_DATA_RETENTION: Final = "data_retention"
REASON_PII: Final = "pii"
REASON_CONTEXT_WINDOW: Final = "context_window"
REASON_UNHEALTHY: Final = "backend_unhealthy"
REASON_EJECTED: Final = "ejected"  # outlier ejection: failures in a row (routing.outliers)
REASON_TENANT_BUDGET: Final = "tenant_budget_exhausted"
REASON_LATENCY_BUDGET: Final = "latency_budget"
# Reasons that mean "the policy forbids it" (403) rather than "nothing can serve it now" (503).
POLICY_REASONS: Final = frozenset(
    {REASON_COMPLIANCE_RULE, REASON_REGION, REASON_DATA_RETENTION, REASON_PII})


class Excluded(NamedTuple):
    key: str  # "backend/model"
    reason: str  # one of the REASON_* names
    detail: str  # for people: which rule, which fact; never request content


class ScopedRule(NamedTuple):
    rule: ComplianceRule
    # `when.routes` and every target of those routes: a target asked for directly is
    # bound by the rules of each route it serves (empty: not scoped to routes)
    names: frozenset[str]

    @classmethod
    def of(cls, rule: ComplianceRule, route_targets: Mapping[str, Sequence[str]]
           ) -> ScopedRule:
        names = set(rule.when.routes)
        for route in rule.when.routes:
            names.update(route_targets.get(route, ()))
        return cls(rule, frozenset(names))


def rule_applies(scoped: ScopedRule, route: str, tenant: str,
                 tags: frozenset[str]) -> bool:
    """Whether the rule binds a request for `route` (a route, or a target asked for
    directly) from `tenant` with `tags`."""
    when = scoped.rule.when
    if when.tenant_tags and tags.isdisjoint(when.tenant_tags):
        return False
    if when.tenants and tenant not in when.tenants:
        return False
    return not (when.routes and route not in scoped.names)


def rule_violation(rule: ComplianceRule, model: TargetModel) -> Excluded | None:
    """Why `model` breaks `rule`, or None when it complies."""
    backend = model.target.backend
    require = rule.require
    if require.regions:
        if backend.region is None:
            return Excluded(model.key, REASON_REGION,
                            f"rule {rule.name!r} requires region {'|'.join(require.regions)}; "
                            f"backend {model.target.backend_name!r} declares no region")
        if not any(fnmatchcase(backend.region, pattern) for pattern in require.regions):
            return Excluded(model.key, REASON_REGION,
                            f"rule {rule.name!r} requires region {'|'.join(require.regions)}; "
                            f"backend region is {backend.region!r}")
    if require.deployment is not None and backend.deployment != require.deployment:
        return Excluded(model.key, REASON_COMPLIANCE_RULE,
                        f"rule {rule.name!r} requires a {require.deployment} deployment")
    if require.data_retention is not None and backend.data_retention != require.data_retention:
        stated = backend.data_retention or "not declared"
        return Excluded(model.key, REASON_DATA_RETENTION,
                        f"rule {rule.name!r} requires data_retention {require.data_retention}; "
                        f"backend's is {stated}")
    return None


def partition_by_rules(models: Sequence[TargetModel], rules: Sequence[ScopedRule],
                       route: str, tenant: str, tags: frozenset[str],
                       ) -> tuple[tuple[TargetModel, ...], tuple[Excluded, ...]]:
    """(allowed, excluded) for everything that depends only on who asks and for what:
    computed once per (route, tenant) and reused."""
    applicable = [scoped.rule for scoped in rules
                  if rule_applies(scoped, route, tenant, tags)]
    allowed: list[TargetModel] = []
    excluded: list[Excluded] = []
    for model in models:
        violation = next(
            (v for v in (rule_violation(rule, model) for rule in applicable) if v), None)
        if violation is None:
            allowed.append(model)
        else:
            excluded.append(violation)
    return tuple(allowed), tuple(excluded)


def sole_targets(routes: Mapping[str, Sequence[TargetModel]], rules: Sequence[ScopedRule],
                 tenants: Mapping[str, frozenset[str]]) -> dict[str, list[str]]:
    """Per target, the "tenant on route" pairs for which it is the only one the rules
    allow on a route of several targets."""
    out: dict[str, list[str]] = {}
    for route, models in routes.items():
        if len(models) < 2:
            continue
        for tenant, tags in tenants.items():
            allowed, _ = partition_by_rules(models, rules, route, tenant, tags)
            if len(allowed) == 1:
                out.setdefault(allowed[0].key, []).append(f"{tenant} on {route}")
    return out


def pii_exclusion(pii_policy: PiiPolicy, found: frozenset[str],
                  model: TargetModel) -> Excluded | None:
    if found and pii_policy.action == "local_only" and not model.dedicated:
        return Excluded(model.key, REASON_PII,
                        f"request contains {', '.join(sorted(found))}; "
                        "pii.action local_only allows dedicated backends only")
    return None
