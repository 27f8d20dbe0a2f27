"""No request is ever served by a target that a compliance rule or an allow-list
excludes: 10,000 random policies (tag-, tenant- and route-scoped rules, allow-lists
per tenant and per key), each asked one request by route or by target name.

The expectation is computed here from the file models with plain loops, not with the
routing code under test.
"""

from __future__ import annotations

import random
from fnmatch import fnmatchcase
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.keys import hash_key
from policies.load import Policy, build
from policies.schema import PolicyFile, Tenant
from routing.decide import Router
from routing.features import FeatureError, build_features
from routing.stats import StatsSnapshot
from routing.tokens import TokenCounter

# Hypothesis draws a seeded Random per example, and each example makes 10 policies
# from it with plain choices: 10,000 policies in seconds (a draw per field would take
# a minute). A failure reports the Random's seed, which replays it.
EXAMPLES = 1_000
POLICIES_PER_EXAMPLE = 10
BACKENDS = ["b1", "b2", "b3", "b4"]
REGIONS = [None, "eu-west-1", "us-east-1"]
TAGS = ["eu", "bank"]
TENANTS = ["t1", "t2"]
KEYS = {tenant: [hash_key(f"{tenant}-k{i}") for i in range(2)] for tenant in TENANTS}
GLOBS = ["*", "r*", "r1", "b1/*", "*/m", "b2/m", "nothing"]
TOKENS = TokenCounter()
EMPTY = StatsSnapshot()

# Each building block is chosen whole from a list of every variant.
BACKEND_VARIANTS = [
    {"type": "openai", "url": "http://127.0.0.1:9/v1", "deployment": deployment,
     "region": region, "data_retention": retention, "models": {"m": {}}}
    for deployment in ("shared", "dedicated") for region in REGIONS
    for retention in (None, "zero", "standard")]
REQUIRES = [{"regions": ["eu-*"]}, {"deployment": "shared"}, {"deployment": "dedicated"},
            {"data_retention": "zero"}]
GLOB_CHOICES: list[list[str] | None] = [None, [], *([glob] for glob in GLOBS), ["r1", "b1/*"]]


def scenario(rng: random.Random) -> tuple[Policy, str, str | None, str]:
    """One random policy and one request: (policy, tenant, key hash or None, model)."""
    names = rng.sample(BACKENDS, rng.randint(1, len(BACKENDS)))
    backends = {name: rng.choice(BACKEND_VARIANTS) for name in names}
    targets = sorted(f"{name}/m" for name in backends)
    routes = {f"r{i}": {"targets": rng.sample(targets, rng.randint(1, min(3, len(targets))))}
              for i in range(rng.randint(1, 2))}
    scopes = [{}, *({"tenant_tags": [tag]} for tag in TAGS),
              *({"tenants": [tenant]} for tenant in TENANTS),
              *({"routes": [route]} for route in routes),
              *({"tenant_tags": [tag], "routes": [route]} for tag in TAGS for route in routes)]
    tenants = {}
    for name in TENANTS:
        tenant: dict[str, Any] = {"api_keys": KEYS[name],
                                  "tags": rng.choice([[], ["eu"], ["bank"], ["eu", "bank"]])}
        for field in ("allow", "allow_targets"):
            globs = rng.choice(GLOB_CHOICES)
            if globs is not None:
                tenant[field] = globs
        if rng.random() < 0.5:
            tenant["key_access"] = {KEYS[name][0]: {"allow": rng.choice(GLOB_CHOICES),
                                                   "allow_targets": rng.choice(GLOB_CHOICES)}}
        tenants[name] = tenant
    # a rule's tag must be some tenant's (a rule that binds nobody is an error)
    held = {tag for tenant in tenants.values() for tag in tenant["tags"]}
    scopes = [scope for scope in scopes if set(scope.get("tenant_tags", ())) <= held]
    rules = [{"name": f"rule{index}", "when": rng.choice(scopes),
              "require": rng.choice(REQUIRES)} for index in range(rng.randint(0, 3))]
    data = {"version": 1, "backends": backends, "routes": routes,
            "compliance": {"rules": rules}, "tenants": tenants,
            "defaults": {"allow_targets": rng.choice([[], ["*"], ["b2/*"]])}}
    policy = build(PolicyFile.model_validate(data))
    tenant_name = rng.choice(TENANTS)
    return (policy, tenant_name, rng.choice([None, *KEYS[tenant_name]]),
            rng.choice([*routes, *targets, "b9/m"]))


def may_ask(policy: Policy, tenant_name: str, key: str | None, asked: str) -> bool:
    tenant: Tenant = policy.file.tenants[tenant_name]
    defaults = policy.file.defaults
    allow = defaults.allow if tenant.allow is None else tenant.allow
    allow_targets = defaults.allow_targets if tenant.allow_targets is None \
        else tenant.allow_targets
    own = tenant.key_access.get(key) if key is not None else None
    if own is not None:
        allow = allow if own.allow is None else own.allow
        allow_targets = allow_targets if own.allow_targets is None else own.allow_targets
    patterns = allow if asked in policy.file.routes else allow_targets
    return any(fnmatchcase(asked, pattern) for pattern in patterns)


def complies(policy: Policy, tenant_name: str, asked: str, target: str) -> bool:
    tenant = policy.file.tenants[tenant_name]
    backend = policy.file.backends[target.split("/")[0]]
    for rule in policy.file.compliance.rules:
        when = rule.when
        if when.tenant_tags and not set(when.tenant_tags) & set(tenant.tags):
            continue
        if when.tenants and tenant_name not in when.tenants:
            continue
        # a route-scoped rule binds the route, and each of its targets asked for by name
        if when.routes and not any(asked == route or asked in policy.file.routes[route].targets
                                   for route in when.routes):
            continue
        need = rule.require
        if need.regions and not (backend.region and any(
                fnmatchcase(backend.region, pattern) for pattern in need.regions)):
            return False
        if need.deployment and backend.deployment != need.deployment:
            return False
        if need.data_retention and backend.data_retention != need.data_retention:
            return False
    return True


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.randoms(use_true_random=False))
def test_no_request_is_served_by_a_target_a_rule_or_an_allow_list_excludes(
        rng: random.Random) -> None:
    for _ in range(POLICIES_PER_EXAMPLE):
        check(*scenario(rng))


def check(policy: Policy, tenant_name: str, key: str | None, asked: str) -> None:
    body = {"model": asked, "messages": [{"role": "user", "content": "hi"}]}
    try:
        features = build_features(body, {}, policy, tenant_name, tokens=TOKENS,
                                  input_tokens=10, key_hash=key)
    except FeatureError as refused:
        assert refused.not_found
        assert (asked not in policy.targets and asked not in policy.routes) or \
            not may_ask(policy, tenant_name, key, asked)
        return
    assert may_ask(policy, tenant_name, key, asked)
    decision = Router(policy).decide(features, EMPTY, 0.0, "id")
    for candidate in decision.candidates:  # the primary, and every fallback
        assert complies(policy, tenant_name, asked, candidate.key), candidate.key
    if decision.rejection is None:  # everything that complies is a candidate
        served = {c.key for c in decision.candidates}
        listed = policy.routes[asked].targets if asked in policy.routes else [asked]
        assert served == {t for t in listed if complies(policy, tenant_name, asked, t)}
