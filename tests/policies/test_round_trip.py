"""`load(dump(policy)) == policy` for any valid policy, and the committed JSON Schema is current."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PolicyFile, build, dump, hash_key, loads
from policies.json_schema import SCHEMA_PATH, policy_json_schema
from policies.reference_doc import render as render_reference
from policies.schema import Backend, Route, Tenant

NAMES = st.from_regex(r"[a-z][a-z0-9_\-]{0,8}", fullmatch=True)
PRICES = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)
RATES = st.floats(min_value=0.5, max_value=1e5, allow_nan=False, allow_infinity=False)
REGIONS = st.sampled_from(["eu-west-1", "eu-central-1", "us", "us-east-1", "local"])
TAGS = st.sampled_from(["eu", "premium", "pii", "internal"])


@st.composite
def model_specs(draw: st.DrawFn) -> dict[str, object]:
    spec: dict[str, object] = {
        "input_usd_per_mtok": draw(PRICES), "output_usd_per_mtok": draw(PRICES)}
    if draw(st.booleans()):
        spec["context_tokens"] = draw(st.integers(1, 2_000_000))
    if draw(st.booleans()):
        spec["upstream_name"] = draw(st.text(min_size=1, max_size=12).filter(
            lambda text: "${" not in text and "$~" not in text))
    if draw(st.booleans()):
        spec["priors"] = {"network_ms": draw(PRICES), "decode_tokens_per_s": draw(RATES),
                          "prefill_tokens_per_s": draw(RATES)}
    return spec


@st.composite
def backends(draw: st.DrawFn) -> dict[str, object]:
    dedicated = draw(st.booleans())
    backend: dict[str, object] = {
        "type": "openai" if dedicated else draw(st.sampled_from(["openai", "anthropic"])),
        "url": "http://127.0.0.1:" + str(draw(st.integers(1, 65535))) + "/v1",
        "deployment": "dedicated" if dedicated else "shared",
        "region": draw(REGIONS),
        "enabled": draw(st.booleans()),
        "models": draw(st.dictionaries(NAMES, model_specs(), min_size=1, max_size=3)),
    }
    if dedicated:
        backend["gpu_hour_usd"] = draw(PRICES)
        backend["max_concurrency"] = draw(st.integers(1, 512))
    else:
        backend["api_key"] = draw(st.text(min_size=1, max_size=20).filter(
            lambda text: "${" not in text and "$~" not in text))
        backend["data_retention"] = draw(st.sampled_from(["zero", "standard"]))
    return backend


@st.composite
def policy_files(draw: st.DrawFn) -> PolicyFile:
    all_backends = draw(st.dictionaries(NAMES, backends(), min_size=1, max_size=3))
    targets = [f"{name}/{model}" for name, backend in all_backends.items()
               for model in backend["models"]]  # type: ignore[attr-defined]
    routes = {
        name: {
            "targets": draw(st.lists(st.sampled_from(targets), min_size=1, max_size=3,
                                     unique=True)),
            "objective": draw(st.sampled_from(["cheapest", "fastest", "ordered"])),
            "latency_budget": {"ttft_ms": draw(RATES)},
            "on_budget_miss": draw(st.sampled_from(["fastest", "reject"])),
        }
        for name in draw(st.lists(NAMES, max_size=3, unique=True))
    }
    keys = iter(hash_key(str(number)) for number in range(1000))
    tenants = {
        name: {
            "api_keys": [next(keys) for _ in range(draw(st.integers(0, 2)))],
            "tags": draw(st.lists(TAGS, max_size=2, unique=True)),
            "priority": draw(st.sampled_from(["high", "normal", "low"])),
            "limits": {"requests_per_minute": draw(st.integers(1, 10_000))},
            "budget": {"usd_per_day": draw(PRICES)},
        }
        for name in draw(st.lists(NAMES, max_size=3, unique=True))
    }
    # a rule's tag must be some tenant's (a rule that binds nobody is an error)
    held = sorted({tag for tenant in tenants.values() for tag in tenant["tags"]})
    rules = [
        {"name": f"rule-{index}", "when": {"tenant_tags": [draw(st.sampled_from(held))]},
         "require": {"regions": [draw(st.sampled_from(["eu-*", "us*", "*"]))]}}
        for index in range(draw(st.integers(0, 2)) if held else 0)
    ]
    data = {
        "version": 1, "backends": all_backends, "routes": routes, "tenants": tenants,
        "compliance": {"pii": {"detect": draw(st.lists(st.sampled_from(["email", "phone"]),
                                                      unique=True)),
                               "action": draw(st.sampled_from(["local_only", "redact"]))},
                       "rules": rules},
        "auth": {"admin_keys": [hash_key("admin")]},
    }
    return PolicyFile.model_validate(data)


@settings(max_examples=60, deadline=None)
@given(policy_files())
def test_dumped_policy_loads_back_equal(policy_file: PolicyFile) -> None:
    policy = loads(dump(policy_file, reveal_secrets=True), source="p.yaml", environ={})
    assert policy.file == policy_file
    # The runtime policy too, apart from where warnings point (the dumped file has lines).
    expected = build(policy_file, source="p.yaml", digest=policy.version_hash)
    assert replace(policy, warnings=()) == replace(expected, warnings=())


def test_dump_masks_secrets_unless_asked() -> None:
    policy_file = PolicyFile.model_validate({"version": 1, "backends": {"a": {
        "type": "openai", "url": "http://x", "api_key": "sk-secret", "models": {"m": {}}}}})
    assert "sk-secret" not in dump(policy_file)
    assert "sk-secret" in dump(policy_file, reveal_secrets=True)


def test_committed_json_schema_is_current() -> None:
    assert json.loads(SCHEMA_PATH.read_text()) == policy_json_schema()


def test_json_schema_accepts_environment_references_for_numbers() -> None:
    backend = policy_json_schema()["$defs"]["Backend"]["properties"]
    assert r'"pattern": "\\$\\{' in json.dumps(backend["gpu_hour_usd"])
    assert r'"pattern": "\\$\\{' not in json.dumps(backend["url"])


def test_shipped_policies_point_editors_at_the_schema() -> None:
    root = Path(__file__).resolve().parents[2] / "policies"
    for path in [root / "default.yaml", *sorted((root / "examples").glob("*.yaml"))]:
        first = path.read_text().splitlines()[0]
        expected = "./policy.schema.json" if path.parent == root else "../policy.schema.json"
        assert first == f"# yaml-language-server: $schema={expected}", path


def _item_patterns(items: dict[str, object]) -> list[str]:
    options = items.get("anyOf", [items])
    assert isinstance(options, list)
    return [option["pattern"] for option in options if "pattern" in option]


def test_json_schema_refuses_what_the_loader_refuses_in_key_hashes_and_targets() -> None:
    # An editor must flag a plain key pasted into api_keys, as `policy check` does.
    defs = policy_json_schema()["$defs"]
    for items, good, bad in (
            (defs["Tenant"]["properties"]["api_keys"]["items"], hash_key("k"), "sk-live-123"),
            (defs["Auth"]["properties"]["admin_keys"]["items"], hash_key("k"), "letmein"),
            (defs["Route"]["properties"]["targets"]["items"], "local/llama", "gpt-4o-mini")):
        patterns = _item_patterns(items)
        assert any(re.search(pattern, good) for pattern in patterns)
        assert not any(re.search(pattern, bad) for pattern in patterns)


def _string_allowed(node: dict[str, object], value: str) -> bool:
    """Whether `value` passes a (string or optional string) node of the JSON Schema."""
    top = node.get("pattern")
    if isinstance(top, str) and not re.search(top, value):
        return False
    options = node.get("anyOf", [node])
    assert isinstance(options, list)
    return any(option.get("type") == "string" and re.search(option.get("pattern", ""), value)
               for option in options)


def test_json_schema_refuses_what_the_loader_refuses_in_backend_urls_and_limit_stores() -> None:
    defs = policy_json_schema()["$defs"]
    url, store = defs["Backend"]["properties"]["url"], defs["LimitStore"]["properties"]["store"]
    assert all(_string_allowed(url, value) for value in (
        "https://api.openai.com/v1", "${LOCAL_URL:-http://127.0.0.1:8001/v1}"))
    assert not _string_allowed(url, "tcp://127.0.0.1:8001")
    assert all(_string_allowed(store, value) for value in (
        "memory", "redis://127.0.0.1:6379/0", "unix:///run/redis.sock", "${REDIS_URL}"))
    assert not any(_string_allowed(store, value) for value in ("mysql://db", "memoryx"))


def _fields_without_description(node: Any, path: str = "") -> list[str]:
    if isinstance(node, list):
        return [p for item in node for p in _fields_without_description(item, path)]
    if not isinstance(node, dict):
        return []
    missing = [f"{path}.{name}" for name, spec in node.get("properties", {}).items()
               if not spec.get("description")]
    for key, value in node.items():
        missing += _fields_without_description(value, f"{path}/{key}")
    return missing


def test_every_field_of_the_json_schema_has_a_description_for_editors() -> None:
    assert _fields_without_description(policy_json_schema()) == []


def test_committed_policy_reference_is_current() -> None:
    # regenerate with `routegate policy reference > docs/policy.md`
    reference = Path(__file__).resolve().parents[2] / "docs" / "policy.md"
    assert reference.read_text() == render_reference()


def test_policy_reference_documents_every_field() -> None:
    text = render_reference()
    for name, model in (("Backend", Backend), ("Tenant", Tenant), ("Route", Route)):
        section = text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        for field in model.model_fields:
            assert f"| `{field}` |" in section, (name, field)
