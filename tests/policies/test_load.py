"""Loading a policy file: interpolation, every error at once, secrets, warnings, lookups."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies import PolicyError, hash_key, load, loads

BASE = """\
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:8001/v1
    deployment: dedicated
    gpu_hour_usd: 2.5
    region: eu-west-1
    models:
      llama: {context_tokens: 8192}
  openai:
    type: openai
    enabled: ${OPENAI_API_KEY:+true}
    url: ${OPENAI_BASE_URL:-https://api.openai.com/v1}
    api_key: ${OPENAI_API_KEY:-}
    region: us
    models:
      gpt-4o-mini: {input_usd_per_mtok: 0.15, output_usd_per_mtok: 0.6}
routes:
  chat: {targets: [local/llama, openai/gpt-4o-mini]}
"""


def test_variable_with_default_uses_the_default_when_unset() -> None:
    policy = loads(BASE, environ={"OPENAI_API_KEY": "sk-1"})
    assert policy.targets["openai/gpt-4o-mini"].backend.url == "https://api.openai.com/v1"


def test_variable_value_replaces_the_reference() -> None:
    policy = loads(BASE, environ={"OPENAI_API_KEY": "sk-1", "OPENAI_BASE_URL": "http://x:1/v1"})
    backend = policy.targets["openai/gpt-4o-mini"].backend
    assert backend.url == "http://x:1/v1"
    assert backend.api_key is not None and backend.api_key.get_secret_value() == "sk-1"


def test_backend_switched_on_by_a_set_variable_only() -> None:
    assert "openai/gpt-4o-mini" not in loads(BASE, environ={}).targets
    assert "openai/gpt-4o-mini" in loads(BASE, environ={"OPENAI_API_KEY": "k"}).targets


def test_route_keeps_only_enabled_targets() -> None:
    assert loads(BASE, environ={}).routes["chat"].targets == ["local/llama"]


def test_substituted_plain_value_takes_its_yaml_type() -> None:
    text = BASE.replace("max_concurrency", "x").replace(
        "    gpu_hour_usd: 2.5\n", "    gpu_hour_usd: 2.5\n    max_concurrency: ${SLOTS}\n")
    policy = loads(text, environ={"SLOTS": "12"})
    assert policy.file.backends["local"].max_concurrency == 12


def test_multi_line_value_from_the_environment_does_not_shift_later_lines() -> None:
    text = BASE.replace("region: us", "region: ${REGION}") + "  oops: {targets: [nowhere/x]}\n"
    with pytest.raises(PolicyError) as raised:
        loads(text, environ={"REGION": "us\n\n\n", "OPENAI_API_KEY": "k"})
    assert (raised.value.line, raised.value.column) == (21, 20)


def test_reference_inside_a_flow_mapping_is_resolved() -> None:
    text = BASE.replace("{input_usd_per_mtok: 0.15,", "{input_usd_per_mtok: ${PRICE:-0.25},")
    policy = loads(text, environ={"OPENAI_API_KEY": "k"})
    assert policy.targets["openai/gpt-4o-mini"].spec.input_usd_per_mtok == 0.25


def test_unset_variable_is_reported_where_it_is_written() -> None:
    text = BASE.replace("{input_usd_per_mtok: 0.15,", "{input_usd_per_mtok: ${PRICE},")
    with pytest.raises(PolicyError) as raised:
        loads(text, environ={})
    issue = raised.value.issues[0]
    assert (issue.line, issue.column, issue.message) == (
        18, 41, "environment variable PRICE is not set")


def test_reference_in_a_comment_is_ignored() -> None:
    policy = loads("# uses ${NOT_SET}\n" + BASE, environ={})
    assert "local/llama" in policy.targets


def test_every_error_of_a_file_is_reported_in_file_order() -> None:
    text = BASE.replace("type: openai", "type: opnai", 1).replace(
        "region: us", "regoin: us").replace("context_tokens: 8192", "context_tokens: -1")
    with pytest.raises(PolicyError) as raised:
        loads(text, source="p.yaml", environ={})
    places = [(issue.line, issue.field_path) for issue in raised.value.issues]
    assert places == [(4, "backends.local.type"),
                      (10, "backends.local.models.llama.context_tokens"),
                      (16, "backends.openai.regoin")]
    assert str(raised.value).count("\n") == 2


def test_secret_is_never_printed_in_an_error() -> None:
    text = BASE.replace("api_key: ${OPENAI_API_KEY:-}", "api_key: [${OPENAI_API_KEY}]")
    with pytest.raises(PolicyError) as raised:
        loads(text, environ={"OPENAI_API_KEY": "sk-very-secret"})
    assert raised.value.field_path == "backends.openai.api_key"
    assert "sk-very-secret" not in str(raised.value)
    assert "sk-very-secret" not in repr(raised.value.issues)


def test_plain_key_pasted_into_api_keys_is_not_echoed() -> None:
    text = BASE + "tenants:\n  acme: {api_keys: [sk-live-abcdef]}\n"
    with pytest.raises(PolicyError) as raised:
        loads(text, environ={})
    assert "sk-live-abcdef" not in str(raised.value)


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as raised:
        load(tmp_path / "missing.yaml")
    assert str(raised.value).startswith(str(tmp_path / "missing.yaml"))


def test_tenant_keys_resolve_to_their_tenant() -> None:
    text = BASE + f"tenants:\n  acme: {{api_keys: ['{hash_key('rg-1')}']}}\n"
    assert loads(text, environ={}).tenant_by_key_hash == {hash_key("rg-1"): "acme"}


def test_version_hash_follows_the_text() -> None:
    first = loads(BASE, environ={})
    assert first.version_hash == loads(BASE, environ={}).version_hash
    assert first.version_hash != loads(BASE + "\n# changed\n", environ={}).version_hash


def test_a_rule_tag_no_tenant_has_is_an_error_with_a_hint() -> None:
    text = BASE + """\
tenants:
  acme: {tags: [eu-west]}
compliance:
  rules:
    - {name: eu, when: {tenant_tags: [eu-wst]}, require: {regions: [eu-*]}}
"""
    with pytest.raises(PolicyError) as caught:
        loads(text, environ={})
    [error] = caught.value.issues
    assert (error.line, error.field_path, error.message) == (
        25, "compliance.rules[0].when.tenant_tags[0]",
        "no tenant has the tag `eu-wst`, so this rule never matches")
    assert error.hint == "did you mean `eu-west`?"


def test_a_tenant_tag_no_rule_matches_is_a_warning_with_a_hint() -> None:
    text = BASE + """\
tenants:
  acme: {tags: [europe, eu]}
compliance:
  rules:
    - {name: eu, when: {tenant_tags: [eu]}, require: {regions: [eu-*]}}
"""
    rendered = [(w.line, w.field_path, w.message) for w in loads(text, environ={}).warnings]
    assert rendered == [(22, "tenants.acme.tags[0]", "no compliance rule matches the tag `europe`")]


def test_tags_are_compared_without_regard_to_case() -> None:
    text = BASE + """\
tenants:
  acme: {tags: [EU]}
compliance:
  rules:
    - {name: eu, when: {tenant_tags: [eu]}, require: {regions: [eu-*]}}
"""
    policy = loads(text, environ={})
    assert not policy.warnings and policy.file.tenants["acme"].tags == ["eu"]


def test_region_pattern_matching_no_backend_is_a_warning() -> None:
    text = BASE + """\
compliance:
  rules:
    - {name: apac, require: {regions: [ap-*]}}
"""
    [warning] = loads(text, environ={}).warnings
    assert warning.field_path == "compliance.rules[0].require.regions[0]"
    assert "matches no backend's region" in warning.message


def test_valid_policy_has_no_warnings() -> None:
    assert loads(BASE, environ={}).warnings == ()


def test_default_limits_are_defined_once_in_the_schema() -> None:
    limits = loads(BASE, environ={}).file.defaults.limits
    assert (limits.requests_per_minute, limits.tokens_per_minute) == (60, 50_000)


def test_literal_dollar_tilde_in_a_value_is_kept_beside_a_reference() -> None:
    # `$~` in a secret must neither be taken for a reference nor crash the loader.
    text = BASE.replace("api_key: ${OPENAI_API_KEY:-}", "api_key: 'pa$~0x$~zz${SUFFIX}'")
    policy = loads(text, environ={"SUFFIX": "!", "OPENAI_API_KEY": "k"})
    api_key = policy.targets["openai/gpt-4o-mini"].backend.api_key
    assert api_key is not None and api_key.get_secret_value() == "pa$~0x$~zz!"


@pytest.mark.parametrize("written", ["${OPENAI_API_KEY-}", "${OPENAI_API_KEY:=k}",
                                     "${ OPENAI_API_KEY }", "${OPENAI_API_KEY:-${OTHER}}"])
def test_reference_the_loader_cannot_resolve_is_an_error_not_literal_text(written: str) -> None:
    # Kept as text, it would be sent to the backend as its API key.
    text = BASE.replace("api_key: ${OPENAI_API_KEY:-}", f"api_key: {written}")
    with pytest.raises(PolicyError) as raised:
        loads(text, environ={"OPENAI_API_KEY": "k", "OTHER": "o"})
    issue = raised.value.issues[0]
    assert (issue.line, issue.field_path) == (15, "backends.openai.api_key")
    assert "${VAR:-default}" in issue.message


def test_rule_may_name_the_anonymous_tenant() -> None:
    # Key-less requests are served as `auth.anonymous.tenant`; a rule can keep them local.
    text = BASE + """\
auth:
  anonymous: {enabled: true, tenant: guest}
compliance:
  rules:
    - name: guests-stay-local
      when: {tenants: [guest]}
      require: {deployment: dedicated}
"""
    policy = loads(text, environ={})
    assert policy.file.compliance.rules[0].when.tenants == ["guest"]


def test_rule_whose_tenants_have_none_of_its_tags_is_a_warning() -> None:
    # `when` conditions must all hold, so this rule can never match.
    text = BASE + """\
tenants:
  acme: {tags: [eu]}
  globex: {tags: [us]}
compliance:
  rules:
    - {name: eu, when: {tenant_tags: [eu]}, require: {regions: [eu-*]}}
    - {name: us, when: {tenant_tags: [us]}, require: {regions: [us]}}
    - {name: acme-us, when: {tenants: [acme], tenant_tags: [us]}, require: {regions: [us]}}
"""
    (warning,) = loads(text, environ={}).warnings
    assert warning.field_path == "compliance.rules[2].when"
    assert "never matches" in warning.message


def test_key_hash_listed_twice_by_one_tenant_is_reported_as_such() -> None:
    key_hash = hash_key("k")
    text = BASE + f"tenants:\n  acme: {{api_keys: [{key_hash}, {key_hash}]}}\n"
    with pytest.raises(PolicyError) as raised:
        loads(text, environ={})
    (issue,) = raised.value.issues
    assert (issue.field_path, issue.message) == ("tenants.acme.api_keys[1]",
                                                 "key hash is listed twice")


def test_an_enabled_backend_with_an_empty_api_key_is_a_warning_at_the_key() -> None:
    text = BASE.replace("    enabled: ${OPENAI_API_KEY:+true}\n", "")
    [warning] = loads(text, environ={}).warnings
    assert (warning.line, warning.field_path) == (14, "backends.openai.api_key")
    assert "enabled but its `api_key` is empty" in warning.message
    assert warning.hint is not None and "${VAR:+true}" in warning.hint
    assert loads(text, environ={"OPENAI_API_KEY": "sk-1"}).warnings == ()
    assert loads(BASE, environ={}).warnings == ()  # switched off with the key unset


def test_ordered_is_an_objective_and_refuses_a_spread() -> None:
    ordered = BASE.replace("chat: {targets: [local/llama, openai/gpt-4o-mini]}",
                           "chat: {targets: [local/llama, openai/gpt-4o-mini], "
                           "objective: ordered}")
    assert loads(ordered, environ={}).file.routes["chat"].objective == "ordered"
    with pytest.raises(PolicyError, match="ordered` has no such equals"):
        loads(ordered.replace("objective: ordered", "objective: ordered, spread: {}"),
              environ={})


def test_a_route_cache_that_can_never_keep_an_answer_is_a_warning_naming_the_field() -> None:
    """With content recording off (the default) a cache keeps nothing unless the route
    opts in; such a cache is a warning (`policy check`, and logged at start-up)."""
    route = "  chat: {targets: [local/llama, openai/gpt-4o-mini]}\n"
    cached = BASE.replace(route, "  chat:\n    targets: [local/llama, openai/gpt-4o-mini]\n"
                                 "    cache: {}\n")
    assert cached != BASE
    [warning] = loads(cached, environ={}).warnings
    assert warning.field_path == "routes.chat.cache"
    assert "can never keep an answer" in warning.message
    assert warning.hint is not None and "store_content: true" in warning.hint
    opted_in = cached.replace("    cache: {}\n", "    cache: {store_content: true}\n")
    assert loads(opted_in, environ={}).warnings == ()
    recording = cached + "compliance: {record_content: true}\n"
    assert loads(recording, environ={}).warnings == ()
