"""Each shipped policy loads cleanly, and `explain` routes sample requests as its header says."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.explain import explain_file, explain_request
from policies import load
from routing.tokens import TokenCounter

ROOT = Path(__file__).resolve().parents[3] / "policies"
EXAMPLES = ROOT / "examples"
TOKENS = TokenCounter()
# what an operator sets for the providers it uses; the examples switch a backend on
# only when its key is set
KEYS = {name: "sk-example" for name in (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_EU_API_KEY", "TOGETHER_API_KEY",
    "FAST_PROVIDER_API_KEY")}


def chat(content: str, model: str = "chat") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}]}


PLAIN = chat("Summarise the plot of Hamlet in three sentences.")
WITH_EMAIL = chat("Please email jo.bloggs@example.com about the invoice.")

# (file, request, tenant, simulated load, expected chosen target, expected exclusions)
CASES = [
    ("local-first-spillover.yaml", PLAIN, None, (), "local/llama-3.1-8b", {}),
    ("local-first-spillover.yaml", PLAIN, None, ("local/llama-3.1-8b=64",),
     "openai/gpt-4o-mini", {"local/llama-3.1-8b": "latency_budget"}),
    ("eu-data-residency.yaml", PLAIN, "acme", (), "azure-eu/gpt-4o-mini",
     {"openai/gpt-4o-mini": "region", "anthropic/claude-haiku-4-5": "region"}),
    ("eu-data-residency.yaml", PLAIN, "globex", (), "openai/gpt-4o-mini", {}),
    ("pii-on-prem.yaml", PLAIN, None, (), "openai/gpt-4o-mini", {}),
    ("pii-on-prem.yaml", WITH_EMAIL, None, (), "onprem/llama-3.1-8b",
     {"openai/gpt-4o-mini": "pii"}),
    ("premium-fastest.yaml", PLAIN, "hooli", (), "local/llama-3.1-8b", {}),
    ("premium-fastest.yaml", chat("Summarise Hamlet.", model="chat-fast"), "initech", (),
     "fast/llama-3.3-70b", {"openai/gpt-4o-mini": "latency_budget"}),
    ("premium-fastest.yaml", PLAIN, "initech", (),  # asks for `chat`, served by `chat-fast`
     "fast/llama-3.3-70b", {"openai/gpt-4o-mini": "latency_budget"}),
    ("multi-provider-fallback.yaml", PLAIN, None, (), "openai/gpt-4o-mini", {}),
]


@pytest.mark.parametrize("path", [*sorted(EXAMPLES.glob("*.yaml")), ROOT / "default.yaml"],
                         ids=lambda path: path.name)
def test_shipped_policy_loads_without_warnings(path: Path) -> None:
    policy = load(path, environ=KEYS)
    assert policy.warnings == ()
    assert path.read_text().splitlines()[1].startswith("# ")  # says what it is for


@pytest.mark.parametrize("path", [*sorted(EXAMPLES.glob("*.yaml")), ROOT / "default.yaml"],
                         ids=lambda path: path.name)
def test_shipped_policy_runs_without_provider_keys(path: Path) -> None:
    policy = load(path, environ={})  # no variable unset without a default
    for warning in policy.warnings:  # nothing enabled with an empty key, at most a route off
        assert "is on a disabled backend" in warning.message, warning.render()
    for name, backend in policy.file.backends.items():
        assert not (backend.enabled and backend.api_key is not None
                    and not backend.api_key.get_secret_value()), name


def test_there_are_five_examples_each_with_an_explained_route() -> None:
    names = {path.name for path in EXAMPLES.glob("*.yaml")}
    assert len(names) >= 5 and names == {case[0] for case in CASES}


@pytest.mark.parametrize(("name", "body", "tenant", "in_flight", "chosen", "excluded"), CASES)
def test_explain_routes_the_sample_request_as_the_example_intends(
        name: str, body: dict[str, Any], tenant: str | None, in_flight: tuple[str, ...],
        chosen: str, excluded: dict[str, str]) -> None:
    decision = explain_request(load(EXAMPLES / name, environ=KEYS), body, tenant=tenant,
                               in_flight=in_flight, tokens=TOKENS)
    assert decision.primary is not None and decision.primary.key == chosen
    assert {e.key: e.reason for e in decision.excluded} == excluded


def test_multi_provider_fallbacks_are_ordered_by_cost() -> None:
    decision = explain_request(load(EXAMPLES / "multi-provider-fallback.yaml", environ=KEYS),
                               PLAIN, tokens=TOKENS)
    assert [c.key for c in decision.candidates] == [
        "openai/gpt-4o-mini", "together/llama-3.3-70b", "anthropic/claude-haiku-4-5"]


def test_explain_prints_candidates_predictions_and_the_choice(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(WITH_EMAIL))
    out = io.StringIO()
    assert explain_file(str(EXAMPLES / "pii-on-prem.yaml"), str(request), environ=KEYS,
                        out=out) == 0
    text = out.getvalue()
    assert "PII: email" in text
    assert "primary  onprem/llama-3.1-8b" in text and "TTFT" in text and "cost $" in text
    assert "openai/gpt-4o-mini               pii: request contains email" in text
    assert text.rstrip().endswith("chosen: onprem/llama-3.1-8b; no fallback")


def test_explain_json_is_the_decision(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(PLAIN))
    out = io.StringIO()
    explain_file(str(EXAMPLES / "eu-data-residency.yaml"), str(request), tenant="acme",
                 as_json=True, environ=KEYS, out=out)
    decision = json.loads(out.getvalue())
    assert decision["candidates"][0]["target"] == "azure-eu/gpt-4o-mini"
    assert decision["features"]["tenant_tags"] == ["eu"]


def test_header_tightens_the_budget(tmp_path: Path) -> None:
    decision = explain_request(load(EXAMPLES / "local-first-spillover.yaml", environ=KEYS),
                               PLAIN, headers=["x-routegate-ttft-budget-ms: 100"],
                               tokens=TOKENS)
    assert decision.features.ttft_budget_ms == 100
    assert [c.key for c in decision.candidates] == ["local/llama-3.1-8b"]


def test_explain_of_an_unknown_tenant_fails(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(PLAIN))
    assert explain_file(str(EXAMPLES / "eu-data-residency.yaml"), str(request),
                        tenant="nobody", environ=KEYS, out=io.StringIO()) == 1


def test_explain_refuses_simulated_load_on_a_target_the_policy_lacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Ignored, a typo would make the simulation silently show an idle backend.
    request = tmp_path / "request.json"
    request.write_text(json.dumps(PLAIN))
    assert explain_file(str(EXAMPLES / "local-first-spillover.yaml"), str(request),
                        in_flight=["local/llama-3.1-8=64"], environ=KEYS, out=io.StringIO()) == 1
    error = capsys.readouterr().err
    assert "--in-flight" in error and "did you mean `local/llama-3.1-8b`?" in error
    assert "request.json" not in error  # the request file is not what is wrong


def test_explain_refuses_a_simulated_load_that_is_not_a_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(PLAIN))
    assert explain_file(str(EXAMPLES / "local-first-spillover.yaml"), str(request),
                        in_flight=["local/llama-3.1-8b=lots"], environ=KEYS,
                        out=io.StringIO()) == 1
    error = capsys.readouterr().err
    assert "--in-flight local/llama-3.1-8b=lots" in error and "request.json" not in error


def test_explain_accepts_the_anonymous_tenant_by_name(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(PLAIN))
    out = io.StringIO()
    assert explain_file(str(EXAMPLES / "local-first-spillover.yaml"), str(request),
                        tenant="anonymous", environ=KEYS, out=out) == 0
    assert "tenant 'anonymous'" in out.getvalue()


@pytest.mark.parametrize(("backend", "says"), [
    ({"launch": {"model": "demo", "replicas": 3}}, "3 launched replicas, pick prefix:"),
    ({"urls": ["http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1"], "pick": "round_robin"},
     "2 listed replicas, pick round_robin:"),
    ({"url": "http://vllm.ns.svc:8000/v1", "resolve": "all",
      "fleet": {"prefix": {"precise": True}}},
     "every address of http://vllm.ns.svc:8000/v1 (resolve: all), pick prefix (precise):"),
])
def test_explain_says_how_a_fleet_target_picks_its_replica(
        tmp_path: Path, backend: dict[str, object], says: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps({
        "version": 1,
        "backends": {"local": {"type": "openai", "deployment": "dedicated",
                               "models": {"demo": {}}, **backend}},
        "routes": {"chat": {"targets": ["local/demo"]}}}))
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": "chat",
                                   "messages": [{"role": "user", "content": "hi"}]}))
    out = io.StringIO()
    assert explain_file(str(policy), str(request), out=out) == 0
    lines = out.getvalue().splitlines()
    at = next(i for i, line in enumerate(lines) if "primary  local/demo" in line)
    assert says in lines[at + 1] and "not simulated offline" in lines[at + 1]
