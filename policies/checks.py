"""Cross-field checks: what no single field can know is wrong.

Errors make the file unusable (a route target that names no backend model,
one key hash on two tenants); warnings load but point at something that is
probably not what was meant (a tenant tag no rule can match).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Protocol

from policies.capabilities import resolve
from policies.errors import PolicyIssue
from policies.hints import did_you_mean
from policies.locate import Place
from policies.schema import PolicyFile


class Locate(Protocol):
    """Maps a field path to its place in the file (or to no place, for models built in
    code); `at_key`: point at the mapping key that ends the path, not at its value."""

    def __call__(self, path: Sequence[str | int], *, at_key: bool = False) -> Place: ...


class Findings:
    def __init__(self, locate: Locate, source: str) -> None:
        self._locate = locate
        self._source = source
        self.errors: list[PolicyIssue] = []
        self.warnings: list[PolicyIssue] = []

    def _issue(self, path: Sequence[str | int], message: str, hint: str | None,
               at_key: bool = False) -> PolicyIssue:
        where = self._locate(path, at_key=at_key)
        return PolicyIssue(message, self._source, where.line, where.column, where.field_path,
                           hint)

    def error(self, path: Sequence[str | int], message: str, hint: str | None = None, *,
              at_key: bool = False) -> None:
        self.errors.append(self._issue(path, message, hint, at_key))

    def warn(self, path: Sequence[str | int], message: str, hint: str | None = None) -> None:
        self.warnings.append(self._issue(path, message, hint))


def check(policy: PolicyFile, locate: Locate, source: str) -> Findings:
    found = Findings(locate, source)
    _check_backends(policy, found)
    _check_routes(policy, found)
    _check_keys(policy, found)
    _check_tenant_routes(policy, found)
    _check_compliance(policy, found)
    _check_access(policy, found)
    _check_capabilities(policy, found)
    _check_batches(policy, found)
    return found


def _check_backends(policy: PolicyFile, found: Findings) -> None:
    for name, backend in policy.backends.items():
        if "/" in name:
            # A target is `backend/model`, split at the first `/`: such a name cannot be
            # told apart from a model name, and its queue would share a key with a target.
            found.error(("backends", name), "a backend name cannot contain `/`",
                        f"rename it, e.g. `{name.replace('/', '-')}`")
        if backend.launch is not None and backend.type != "openai":
            found.error(("backends", name, "launch"),
                        "`launch` starts a local_backend, which speaks the OpenAI API",
                        "write `type: openai`")
        if backend.enabled and backend.api_key is not None and (
                not backend.api_key.get_secret_value()):
            # `api_key: ${OPENAI_API_KEY:-}` with the variable unset: every request to it
            # would come back 401, and it would count as ready
            found.warn(("backends", name, "api_key"),
                       "the backend is enabled but its `api_key` is empty",
                       "set the key's variable, or write `enabled: ${VAR:+true}` so that the "
                       "backend is on only when the key is set")
        if backend.deployment == "dedicated" and backend.gpu_hour_usd is None:
            found.warn(("backends", name, "deployment"),
                       "a dedicated backend without `gpu_hour_usd` is costed as free",
                       "set gpu_hour_usd (0 when it really costs nothing)")
        if backend.deployment == "shared" and backend.gpu_hour_usd is not None:
            found.warn(("backends", name, "gpu_hour_usd"),
                       "`gpu_hour_usd` is ignored on a shared (pay per token) backend",
                       "write `deployment: dedicated`, or use input/output_usd_per_mtok")


def _check_routes(policy: PolicyFile, found: Findings) -> None:
    backend_of = {f"{backend_name}/{model}": backend
                  for backend_name, backend in policy.backends.items()
                  for model in backend.models}
    all_targets = list(backend_of)
    for route_name, route in policy.routes.items():
        if route_name in all_targets:
            found.error(("routes", route_name),
                        f"route `{route_name}` has the name of a backend model and hides it")
        seen: set[str] = set()
        for index, target in enumerate(route.targets):
            path = ("routes", route_name, "targets", index)
            if target not in all_targets:
                found.error(path, f"target `{target}` names no backend model",
                            did_you_mean(target, all_targets))
            elif target in seen:
                found.error(path, f"target `{target}` is listed twice")
            seen.add(target)
        if route.cache is not None and not route.cache.may_keep(policy.compliance.record_content):
            found.warn(("routes", route_name, "cache"),
                       f"route `{route_name}` has a cache that can never keep an answer: "
                       "`compliance.record_content` is off",
                       "set `cache.store_content: true` on the route (or "
                       "`compliance.record_content: true`) to keep answers")
        enabled = [t for t in route.targets if t in backend_of and backend_of[t].enabled]
        if len(enabled) == 0 and all(t in all_targets for t in route.targets):
            found.warn(("routes", route_name, "targets"),
                       f"every target of route `{route_name}` is on a disabled backend; "
                       "clients asking for it get 404")


def _check_tenant_routes(policy: PolicyFile, found: Findings) -> None:
    routes = list(policy.routes)
    for tenant_name, tenant in policy.tenants.items():
        for asked, served in tenant.routes.items():
            path = ("tenants", tenant_name, "routes", asked)
            # The asked-for route is the key of the override, the served one its value.
            for name, at_key in ((asked, True), (served, False)):
                if name not in policy.routes:
                    found.error(path, f"route `{name}` does not exist",
                                did_you_mean(name, routes), at_key=at_key)


def _check_keys(policy: PolicyFile, found: Findings) -> None:
    owner: dict[str, str] = {}
    for tenant_name, tenant in policy.tenants.items():
        for index, key_hash in enumerate(tenant.api_keys):
            if owner.get(key_hash) == tenant_name:
                found.error(("tenants", tenant_name, "api_keys", index),
                            "key hash is listed twice")
            elif key_hash in owner:
                found.error(("tenants", tenant_name, "api_keys", index),
                            f"key hash already belongs to tenant `{owner[key_hash]}`")
            owner.setdefault(key_hash, tenant_name)
    admin_seen: set[str] = set()
    for index, key_hash in enumerate(policy.auth.admin_keys):
        if key_hash in admin_seen:
            found.error(("auth", "admin_keys", index), "admin key hash is listed twice")
        admin_seen.add(key_hash)
        if key_hash in owner:
            found.warn(("auth", "admin_keys", index),
                       f"admin key is also an API key of tenant `{owner[key_hash]}`",
                       "give admins a key of their own")


def _check_compliance(policy: PolicyFile, found: Findings) -> None:
    tenant_tags = {tag for tenant in policy.tenants.values() for tag in tenant.tags}
    rule_tags = {tag for rule in policy.compliance.rules for tag in rule.when.tenant_tags}
    regions = sorted({b.region for b in policy.backends.values() if b.region is not None})
    # Key-less requests are served as the anonymous tenant, declared or not.
    anonymous = policy.auth.anonymous
    known_tenants = {*policy.tenants, *([anonymous.tenant] if anonymous.enabled else [])}
    names: set[str] = set()
    for index, rule in enumerate(policy.compliance.rules):
        base = ("compliance", "rules", index)
        if rule.name in names:
            found.error((*base, "name"), f"rule name `{rule.name}` is used twice")
        names.add(rule.name)
        for position, named in enumerate(rule.when.tenants):
            if named not in known_tenants:
                found.error((*base, "when", "tenants", position), f"no tenant `{named}`",
                            did_you_mean(named, known_tenants))
        for position, route in enumerate(rule.when.routes):
            if route not in policy.routes:
                found.error((*base, "when", "routes", position), f"no route `{route}`",
                            did_you_mean(route, policy.routes))
        for position, tag in enumerate(rule.when.tenant_tags):
            # an error: a rule meant to keep data somewhere that silently binds nobody
            if tag not in tenant_tags:
                found.error((*base, "when", "tenant_tags", position),
                            f"no tenant has the tag `{tag}`, so this rule never matches",
                            did_you_mean(tag, tenant_tags)
                            or "tag the tenants it is for, or remove the rule")
        listed = [policy.tenants.get(named) for named in rule.when.tenants]
        if rule.when.tenant_tags and listed and not any(
                tenant is not None and set(tenant.tags) & set(rule.when.tenant_tags)
                for tenant in listed):
            found.warn((*base, "when"), "no tenant in `when.tenants` has any of "
                       "`when.tenant_tags`, and both must hold, so this never matches",
                       "drop one of the two, or give the tenants the tag")
        for position, pattern in enumerate(rule.require.regions):
            if not any(fnmatch.fnmatchcase(region, pattern) for region in regions):
                found.warn((*base, "require", "regions", position),
                           f"region pattern `{pattern}` matches no backend's region "
                           "(requests under this rule have nowhere to go)",
                           did_you_mean(pattern, regions))
    for tenant_name, tenant in policy.tenants.items():
        for position, tag in enumerate(tenant.tags):
            if tag not in rule_tags:
                found.warn(("tenants", tenant_name, "tags", position),
                           f"no compliance rule matches the tag `{tag}`",
                           did_you_mean(tag, rule_tags))
    pii = policy.compliance.pii
    if pii.detect and pii.action == "local_only" and not any(
            b.deployment == "dedicated" and b.enabled for b in policy.backends.values()):
        found.warn(("compliance", "pii", "action"),
                   "`local_only` with no enabled dedicated backend rejects every request "
                   "that carries PII")


def _check_access(policy: PolicyFile, found: Findings) -> None:
    routes = list(policy.routes)
    targets = [f"{b}/{m}" for b, backend in policy.backends.items() for m in backend.models]
    for tenant_name, tenant in policy.tenants.items():
        base = ("tenants", tenant_name)
        for key_hash in tenant.key_access:
            if key_hash not in tenant.api_keys:
                found.error((*base, "key_access", key_hash),
                            "`key_access` names a key that is not one of this tenant's "
                            "`api_keys`", at_key=True)
        for field_name, kind, names in (("allow", "route", routes),
                                        ("allow_targets", "target", targets)):
            for position, pattern in enumerate(getattr(tenant, field_name) or ()):
                if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                    found.warn((*base, field_name, position), f"`{pattern}` matches no {kind}",
                               did_you_mean(pattern, names))


def _check_capabilities(policy: PolicyFile, found: Findings) -> None:
    """A route none of whose targets can do what another route's can (tools, vision, ...)
    refuses such requests with a 400: worth saying before a client finds out."""
    models = {f"{b}/{m}": resolve(backend, spec)
              for b, backend in policy.backends.items() if backend.enabled
              for m, spec in backend.models.items()}
    can = {name: frozenset().union(*(models[t].names() for t in route.targets if t in models))
           for name, route in policy.routes.items()}
    everywhere = frozenset().union(*can.values())
    for name, has in can.items():
        for capability in sorted(everywhere - has):
            others = [other for other, theirs in can.items() if capability in theirs]
            found.warn(("routes", name, "targets"),
                       f"no target of route `{name}` supports {capability} (route "
                       f"`{others[0]}` does): such requests to `{name}` get a 400",
                       f"add a target that supports {capability} as a fallback")


def _check_batches(policy: PolicyFile, found: Findings) -> None:
    """A spill target is one of its route's shared targets: routing's compliance filters
    apply to it as to any candidate, and a spill leaves dedicated capacity."""
    shared = {f"{name}/{model}" for name, backend in policy.backends.items()
              if backend.deployment == "shared" for model in backend.models}
    for route_name, batch_route in policy.batches.routes.items():
        route = policy.routes.get(route_name)
        if route is None:
            found.error(("batches", "routes", route_name), f"`{route_name}` names no route",
                        did_you_mean(route_name, list(policy.routes)), at_key=True)
            continue
        for index, target in enumerate(batch_route.spill_to):
            path = ("batches", "routes", route_name, "spill_to", index)
            if target not in route.targets:
                found.error(path, f"`{target}` is not a target of route `{route_name}`",
                            "add it to the route's targets (after the interactive ones, "
                            "with `objective: ordered`)")
            elif target not in shared:
                found.error(path, f"`{target}` is not on a shared backend; batch lines "
                            "spill from dedicated capacity to shared targets")
