"""What `/readyz` decides: per route, and per tenant's compliant targets, whether a
request could be served now.

A backend that is up is not enough: with a paid backend ready and the launched local
one still warming up, a tenant whose compliance rules allow only the local backend
had nothing to go to while `/readyz` said ready. So (`server.readyz: all_routes`, the
default) the gateway is ready when every route has a target that is ready (its
backend ready, the target not ejected), and for every tenant and every route it may
use, some target its compliance rules leave it is ready. `any` keeps the older rule:
one ready backend.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from policies.load import Policy
from routing.compliance import ScopedRule, rule_applies, rule_violation
from routing.predict import TargetModel

READY = "ready"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    routes: dict[str, str]  # route → "ready" or why not
    tenants: dict[str, str] = field(default_factory=dict)  # only the tenants left without


def target_state(policy: Policy, key: str, backends: Mapping[str, str],
                 ejected: Collection[str]) -> str:
    target = policy.targets.get(key)
    if target is None:
        return "its backend is disabled"
    if key in ejected:
        return "ejected (failures in a row)"
    state = backends.get(target.backend_name, "unknown")
    return READY if state == READY else f"backend '{target.backend_name}': {state}"


def _why_none(policy: Policy, keys: list[str], backends: Mapping[str, str],
              ejected: Collection[str]) -> str:
    if not keys:
        return "no target is enabled"
    return "no target is ready (" + "; ".join(
        f"{key}: {target_state(policy, key, backends, ejected)}" for key in keys) + ")"


def readiness(policy: Policy, backends: Mapping[str, str],
              ejected: Collection[str]) -> Readiness:
    """`backends`: `ready` or why not, per enabled backend; `ejected`: target keys."""
    route_keys = {name: list(route.targets) for name, route in policy.routes.items()}
    routes: dict[str, str] = {}
    for name, keys in route_keys.items():
        ok = any(target_state(policy, key, backends, ejected) == READY for key in keys)
        routes[name] = READY if ok else _why_none(policy, keys, backends, ejected)
    tenants = _tenants_without(policy, route_keys, backends, ejected)
    any_backend = any(state == READY for state in backends.values())
    if policy.file.server.readyz == "any":
        ready = any_backend
    else:
        ready = any_backend and all(s == READY for s in routes.values()) and not tenants
    return Readiness(ready, routes, tenants)


def _tenants_without(policy: Policy, route_keys: Mapping[str, list[str]],
                     backends: Mapping[str, str], ejected: Collection[str]) -> dict[str, str]:
    """Tenants bound by compliance rules that have a route whose compliant targets are
    all unready (a tenant with no compliant target at all is a policy matter: 403)."""
    rules = policy.file.compliance.rules
    if not rules:
        return {}
    scoped = [ScopedRule.of(rule, {n: r.targets for n, r in policy.file.routes.items()})
              for rule in rules]
    out: dict[str, str] = {}
    for tenant, spec in policy.file.tenants.items():
        tags = frozenset(spec.tags)
        for route in sorted(policy.access_of(tenant).routes):
            applicable = [s.rule for s in scoped if rule_applies(s, route, tenant, tags)]
            if not applicable:
                continue
            compliant = [key for key in route_keys.get(route, ()) if key in policy.targets
                         and not any(rule_violation(rule, TargetModel.of(policy.targets[key]))
                                     for rule in applicable)]
            if compliant and not any(
                    target_state(policy, key, backends, ejected) == READY
                    for key in compliant):
                out[tenant] = (f"route '{route}': of the targets its compliance rules "
                               "allow, " + _why_none(policy, compliant, backends, ejected))
                break
    return out
