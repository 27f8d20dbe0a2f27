"""Capability filters: what a request needs against what each target can do, and why not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.capabilities import from_report
from policies.load import loads
from routing.capabilities import LOGPROBS, TOOLS, VISION, Learned
from routing.decide import RouteDecision, Router
from routing.features import RequestFeatures
from routing.stats import StatsSnapshot

POLICY = loads("""
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:8001/v1
    deployment: dedicated
    gpu_hour_usd: 0
    models:
      demo: {context_tokens: 2048, capabilities: {tools: false, vision: false, n: 1}}
  shared:
    type: openai
    url: http://127.0.0.1:8002/v1
    models:
      m: {input_usd_per_mtok: 1, output_usd_per_mtok: 2, context_tokens: 128000}
  claude:
    type: anthropic
    url: http://127.0.0.1:8003
    models:
      haiku: {input_usd_per_mtok: 1, output_usd_per_mtok: 5, max_output_tokens: 4096}
routes:
  chat: {targets: [local/demo, shared/m]}
  local-only: {targets: [local/demo]}
  claude: {targets: [claude/haiku]}
""")
EMPTY = StatsSnapshot()
REQUEST = RequestFeatures(
    route="chat", tenant="t", tenant_tags=frozenset(), priority="normal",
    input_tokens=200, output_tokens=100, output_tokens_source="request", stream=False,
    pii=frozenset(), ttft_budget_ms=None, total_budget_ms=None)


def decide(router: Router | None = None, **changes: object) -> RouteDecision:
    return (router or Router(POLICY)).decide(replace(REQUEST, **changes), EMPTY, 0.0)


def test_a_plain_request_goes_to_the_free_local_target_first() -> None:
    assert [c.key for c in decide().candidates] == ["local/demo", "shared/m"]


def test_a_tools_request_skips_the_target_without_tools_and_says_why() -> None:
    decision = decide(needs=TOOLS)
    assert [c.key for c in decision.candidates] == ["shared/m"]
    assert [(e.key, e.reason) for e in decision.excluded] == [("local/demo", "capability: tools")]
    assert decision.to_dict()["excluded"][0]["reason"] == "capability: tools"


def test_a_tools_request_on_a_route_without_tools_is_a_400_naming_it_and_the_targets() -> None:
    rejection = decide(route="local-only", needs=TOOLS).rejection
    assert rejection is not None
    assert (rejection.status, rejection.code, rejection.param) == \
        (400, "unsupported_parameter", "tools")
    assert "tools" in rejection.message and "local/demo" in rejection.message


def test_a_vision_request_on_a_route_without_vision_is_a_400_naming_messages() -> None:
    rejection = decide(route="local-only", needs=VISION).rejection
    assert rejection is not None and (rejection.status, rejection.param) == (400, "messages")
    assert "vision" in rejection.message


def test_more_choices_than_a_target_gives_exclude_it() -> None:
    decision = decide(choices=4)
    assert [c.key for c in decision.candidates] == ["shared/m"]
    assert decision.excluded[0].reason == "capability: n"


def test_the_anthropic_default_has_tools_and_vision_but_no_logprobs_or_choices() -> None:
    assert decide(route="claude", needs=TOOLS | VISION).rejection is None
    for changes in ({"needs": LOGPROBS}, {"choices": 2}):
        rejection = decide(route="claude", **changes).rejection  # type: ignore[arg-type]
        assert rejection is not None and rejection.status == 400


def test_asking_for_more_output_than_the_model_allows_excludes_it() -> None:
    decision = decide(route="claude", output_tokens=8000)
    assert decision.rejection is not None and decision.rejection.param == "max_tokens"
    # an estimate the client did not ask for is no reason to refuse
    assert decide(route="claude", output_tokens=8000,
                  output_tokens_source="route_default").rejection is None


def test_a_prompt_longer_than_the_local_context_falls_back_to_the_larger_one() -> None:
    decision = decide(input_tokens=5000)
    assert [c.key for c in decision.candidates] == ["shared/m"]
    assert decision.excluded[0].reason == "context_window"


def test_a_prompt_longer_than_every_context_is_a_400_context_length_exceeded() -> None:
    rejection = decide(route="local-only", input_tokens=5000).rejection
    assert rejection is not None
    assert (rejection.status, rejection.code, rejection.param) == \
        (400, "context_length_exceeded", "messages")
    assert "local/demo" in rejection.message


def test_what_a_launched_backend_reports_replaces_its_type_defaults() -> None:
    launched = loads("""
version: 1
backends:
  local:
    type: openai
    launch: {model: demo}
    models: {demo: {}}
routes: {chat: {targets: [local/demo]}}
""")
    before = Router(launched).decide(replace(REQUEST, needs=LOGPROBS), EMPTY, 0.0)
    assert before.rejection is not None  # nothing assumed before it reports
    report = from_report({"id": "demo", "max_model_len": 1024,
                          "capabilities": {"logprobs": True, "tools": False, "n": 16}})
    assert report is not None
    after = Router(launched, {"local/demo": report})
    assert after.decide(replace(REQUEST, needs=LOGPROBS, choices=8), EMPTY, 0.0).rejection \
        is None
    overflow = after.decide(replace(REQUEST, input_tokens=2000), EMPTY, 0.0).rejection
    assert overflow is not None and overflow.code == "context_length_exceeded"


def test_the_policy_file_wins_over_a_report() -> None:
    report = from_report({"id": "demo", "capabilities": {"tools": True}})
    assert report is not None
    decision = Router(POLICY, {"local/demo": report}).decide(
        replace(REQUEST, needs=TOOLS), EMPTY, 0.0)
    assert [c.key for c in decision.candidates] == ["shared/m"]  # the file says tools: false


@pytest.mark.parametrize("learn", ["lack", "overflow"])
def test_what_a_backend_answered_it_cannot_do_is_remembered_for_the_target(
        learn: str) -> None:
    learned = Learned()
    if learn == "lack":
        learned.lack("shared/m", TOOLS)
        changes: dict[str, object] = {"needs": TOOLS}
    else:
        learned.overflowed("shared/m", 10_000)
        changes = {"input_tokens": 9_950}
    decision = decide(Router(POLICY, learned=learned), **changes)
    assert decision.candidates == () and decision.rejection is not None
    assert decision.rejection.status == 400
    assert [c.key for c in decide(**changes).candidates] == ["shared/m"]  # before: served
