"""Request features: tokens, output estimate, tenant facts, PII, the tightened budget."""

from collections.abc import Mapping
from typing import Any

import pytest

from routing.features import FeatureError, RequestFeatures, build_features
from routing.pii import CATEGORIES, PiiScanner
from routing.stats import LiveStats
from routing.tokens import TokenCounter
from tests.routing.policies import policy

POLICY = policy()
TOKENS = TokenCounter()
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}


def features(body: Mapping[str, Any] = BODY, headers: Mapping[str, str] | None = None,
             tenant: str = "acme", **kwargs: Any) -> RequestFeatures:
    return build_features(body, headers or {}, POLICY, tenant, tokens=TOKENS, **kwargs)


def test_input_tokens_tenant_tags_priority_and_stream_flag() -> None:
    result = features({**BODY, "stream": True}, tenant="globex")
    assert result.input_tokens == TOKENS.count_request(BODY)
    assert (result.route, result.tenant, result.priority, result.stream) == \
        ("chat", "globex", "low", True)
    assert features().tenant_tags == {"eu"}


def test_output_tokens_come_from_the_request_first() -> None:
    result = features({**BODY, "max_tokens": 100, "max_completion_tokens": 42})
    assert (result.output_tokens, result.output_tokens_source) == (42, "request")


def test_output_tokens_fall_back_to_the_route_running_mean_then_its_default() -> None:
    stats = LiveStats()
    assert features(stats=stats.snapshot()).output_tokens_source == "route_default"
    for tokens in (100, 200, 300):
        stats.record_output_tokens("chat", tokens)
    result = features(stats=stats.snapshot())
    assert (result.output_tokens, result.output_tokens_source) == (200, "route_mean")


def test_headers_tighten_the_route_budget() -> None:
    result = features(headers={"x-routegate-ttft-budget-ms": "300",
                               "x-routegate-total-budget-ms": "5000"})
    assert (result.ttft_budget_ms, result.total_budget_ms) == (300.0, 5000.0)


def test_headers_never_loosen_the_route_budget() -> None:
    result = features(headers={"x-routegate-ttft-budget-ms": "90000"})
    assert result.ttft_budget_ms == 800.0


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan", "inf"])
def test_a_malformed_budget_header_is_a_client_error(value: str) -> None:
    with pytest.raises(FeatureError) as caught:
        features(headers={"x-routegate-ttft-budget-ms": value})
    assert caught.value.param == "x-routegate-ttft-budget-ms"


def test_pii_categories_are_recorded_without_the_text() -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "I am a@b.io"}]}
    assert features(body, pii=PiiScanner(CATEGORIES)).pii == {"email"}


def test_a_target_key_can_be_asked_for_directly_when_allow_targets_allows_it() -> None:
    direct = {**BODY, "model": "openai/gpt-4o-mini"}
    assert features(direct, tenant="globex").route == "openai/gpt-4o-mini"


def test_a_target_key_not_in_allow_targets_does_not_exist_for_the_caller() -> None:
    with pytest.raises(FeatureError) as caught:
        features({**BODY, "model": "openai/gpt-4o-mini"}, tenant="acme")
    assert caught.value.not_found and caught.value.param == "model"
    with pytest.raises(FeatureError):
        features({**BODY, "model": "local/llama"}, tenant="globex")  # not under openai/*


@pytest.mark.parametrize(("extra", "needs"), [
    ({}, []),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, ["tools"]),
    ({"tool_choice": "required"}, ["tools"]),
    ({"tool_choice": "none"}, []),
    ({"response_format": {"type": "json_object"}}, ["json_mode"]),
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, ["json_schema"]),
    ({"response_format": {"type": "text"}}, []),
    ({"logprobs": True, "top_logprobs": 2}, ["logprobs"]),
    ({"logprobs": False}, []),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]},
     ["vision"]),
    ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, ["audio"]),
    ({"n": 3}, ["n"]),
])
def test_the_capabilities_a_request_needs_are_read_from_its_body(
        extra: dict[str, Any], needs: list[str]) -> None:
    assert features({**BODY, **extra}).to_dict()["needs"] == needs


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": []}, "model"),
    ({"model": "nope", "messages": []}, "model"),
    ({"model": "chat", "max_tokens": 0}, "max_tokens"),
])
def test_unroutable_requests_name_the_parameter(body: dict, param: str) -> None:
    with pytest.raises(FeatureError) as caught:
        features(body)
    assert caught.value.param == param
