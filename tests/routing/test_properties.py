"""Properties of decide() over random policies, live stats and requests.

500 random policies × 20 random requests each = 10,000 decisions per run.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.load import Policy, build
from policies.schema import PolicyFile
from routing.decide import RouteDecision, Router
from routing.features import RequestFeatures
from routing.pii import CATEGORIES
from routing.stats import LiveStats, StatsSnapshot

POLICIES = 500
REQUESTS_PER_POLICY = 20
REGIONS = [None, "eu-west-1", "eu-central-1", "us", "us-east-1", "ap-south-1"]
TAGS = ["eu", "us", "bank"]
REGION_RULES = {"eu": ["eu-*"], "us": ["us", "us-*"]}

model_spec = st.fixed_dictionaries({
    "input_usd_per_mtok": st.floats(0, 20, allow_nan=False),
    "output_usd_per_mtok": st.floats(0, 60, allow_nan=False),
    "context_tokens": st.one_of(st.none(), st.integers(500, 200_000)),
    "priors": st.fixed_dictionaries({
        "network_ms": st.floats(0, 300), "prefill_tokens_per_s": st.floats(100, 20_000),
        "decode_tokens_per_s": st.floats(5, 300),
        "ttft_ms": st.one_of(st.none(), st.floats(0, 500))}),
})
backend: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries({
    "type": st.just("openai"),
    "url": st.just("http://127.0.0.1:9/v1"),
    "deployment": st.sampled_from(["shared", "dedicated"]),
    "region": st.sampled_from(REGIONS),
    "data_retention": st.sampled_from([None, "zero", "standard"]),
    "gpu_hour_usd": st.one_of(st.none(), st.floats(0, 10)),
    "max_concurrency": st.one_of(st.none(), st.integers(1, 16)),
    "models": st.dictionaries(st.sampled_from(["m1", "m2"]), model_spec, min_size=1),
})


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    backends = draw(st.dictionaries(st.sampled_from(["b1", "b2", "b3", "b4", "b5", "b6"]),
                                    backend, min_size=1, max_size=6))
    keys = sorted(f"{name}/{model}" for name, spec in backends.items() for model in spec["models"])
    routes = {
        f"r{i}": {
            "targets": draw(st.lists(st.sampled_from(keys), min_size=1, unique=True)),
            "objective": draw(st.sampled_from(["cheapest", "fastest", "ordered"])),
            "on_budget_miss": draw(st.sampled_from(["fastest", "reject"])),
            "latency_budget": {"ttft_ms": draw(st.one_of(st.none(), st.floats(10, 5000))),
                               "total_ms": draw(st.one_of(st.none(), st.floats(100, 60_000)))},
        } for i in range(draw(st.integers(1, 3)))
    }
    rules: list[dict[str, Any]] = [
        {"name": f"{tag}-region", "when": {"tenant_tags": [tag]}, "require": {"regions": regions}}
        for tag, regions in REGION_RULES.items() if draw(st.booleans())
    ]
    if draw(st.booleans()):
        rules.append({"name": "bank-zdr", "when": {"tenant_tags": ["bank"]},
                      "require": {"data_retention": "zero"}})
    tenants = {f"t{i}": {"tags": draw(st.lists(st.sampled_from(TAGS), unique=True))}
               for i in range(3)}
    # a rule's tag must be some tenant's (a rule that binds nobody is an error)
    held = {tag for tenant in tenants.values() for tag in tenant["tags"]}
    rules = [rule for rule in rules if set(rule["when"]["tenant_tags"]) <= held]
    data: dict[str, Any] = {
        "version": 1, "backends": backends, "routes": routes,
        "compliance": {"pii": {"detect": list(CATEGORIES),
                               "action": draw(st.sampled_from(["local_only", "redact", "block"]))},
                       "rules": rules},
        "tenants": tenants,
    }
    return build(PolicyFile.model_validate(data))


@st.composite
def live_stats(draw: st.DrawFn, keys: list[str]) -> StatsSnapshot:
    stats = LiveStats()
    for key in keys:
        for _ in range(draw(st.integers(0, 20))):
            stats.request_started(key)
        for _ in range(draw(st.integers(0, 2))):
            ttft = draw(st.floats(1, 3000))
            stats.record_success(key, network_ms=draw(st.floats(0, 200)), ttft_ms=ttft,
                                 total_ms=ttft + draw(st.floats(0, 20_000)),
                                 output_tokens=draw(st.integers(0, 2000)),
                                 explained_ttft_ms=draw(st.floats(0, 3000)))
        if draw(st.integers(0, 9)) == 0:
            stats.eject(key, until=draw(st.floats(0, 100)))
        if draw(st.booleans()):
            stats.set_backend_load(key, 0.0, waiting=draw(st.integers(0, 10)),
                                   running=draw(st.integers(0, 20)),
                                   kv_cache_use=draw(st.floats(0, 1)))
    return stats.snapshot()


def requests(policy: Policy) -> st.SearchStrategy[RequestFeatures]:
    tenants = policy.file.tenants
    return st.builds(
        lambda route, tenant, pii, tokens, out, ttft, total, left: RequestFeatures(
            route=route, tenant=tenant, tenant_tags=frozenset(tenants[tenant].tags),
            priority="normal", input_tokens=tokens, output_tokens=out,
            output_tokens_source="request", stream=False, pii=frozenset(pii),
            ttft_budget_ms=ttft, total_budget_ms=total, tenant_budget_left_micro_usd=left),
        st.sampled_from(sorted(policy.routes) + sorted(policy.targets)),
        st.sampled_from(sorted(tenants)),
        st.lists(st.sampled_from(CATEGORIES), max_size=2),
        st.integers(0, 150_000), st.integers(1, 8000),
        st.one_of(st.none(), st.floats(1, 5000)), st.one_of(st.none(), st.floats(10, 60_000)),
        st.one_of(st.none(), st.integers(-10, 100_000)),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Policy, StatsSnapshot, list[RequestFeatures]]:
    policy = draw(policies())
    stats = draw(live_stats(sorted(policy.targets)))
    batch = draw(st.lists(requests(policy), min_size=REQUESTS_PER_POLICY,
                          max_size=REQUESTS_PER_POLICY))
    return policy, stats, batch


def route_targets(policy: Policy, route: str) -> list[str]:
    return list(policy.routes[route].targets) if route in policy.routes else [route]


def check(policy: Policy, decision: RouteDecision, request: RequestFeatures) -> None:
    candidates = [c.key for c in decision.candidates]
    excluded = [e.key for e in decision.excluded]
    # An excluded candidate never appears among the primary and fallbacks, and every
    # target of the route is accounted for exactly once.
    assert not set(candidates) & set(excluded)
    if not (request.pii and policy.file.compliance.pii.action == "block"):
        assert sorted(candidates + excluded) == sorted(route_targets(policy, request.route))
    if decision.rejection is not None:
        assert candidates == []
    # PII under local_only never reaches a shared API.
    if request.pii and policy.file.compliance.pii.action == "local_only":
        assert all(c.target.backend.deployment == "dedicated" for c in decision.candidates)
    if request.pii and policy.file.compliance.pii.action == "block":
        assert decision.rejection is not None and decision.rejection.status == 403
    # A tenant tagged for a region never gets a backend outside it.
    for rule in policy.file.compliance.rules:
        if rule.require.regions and request.tenant_tags & set(rule.when.tenant_tags):
            for candidate in decision.candidates:
                region = candidate.target.backend.region
                assert region is not None
                assert any(fnmatchcase(region, pattern) for pattern in rule.require.regions)
    # The tenant's remaining budget is not overspent where an affordable target exists,
    # and a spent budget gets nothing.
    left = request.tenant_budget_left_micro_usd
    if left is not None and decision.candidates and decision.candidates[0].cost_micro_usd > left:
        assert left > 0
        assert all(c.cost_micro_usd > left for c in decision.candidates)
        assert not any(e.reason == "tenant_budget_exhausted" for e in decision.excluded)


@settings(max_examples=POLICIES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_decisions_respect_compliance_and_are_deterministic(
        scenario: tuple[Policy, StatsSnapshot, list[RequestFeatures]]) -> None:
    policy, stats, batch = scenario
    router = Router(policy)
    decisions = [router.decide(request, stats, 5.0, "id") for request in batch]
    for request, decision in zip(batch, decisions, strict=True):
        check(policy, decision, request)
    # Deterministic: the same inputs give the same decision, from the warm cache
    # or from a router built afresh.
    fresh = Router(policy)
    assert [fresh.decide(request, stats, 5.0, "id") for request in batch] == decisions
    assert [router.decide(request, stats, 5.0, "id") for request in batch] == decisions
