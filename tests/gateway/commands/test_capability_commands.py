"""`policy explain` and `policy check` on capabilities and access."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.policy.explain import explain_file
from tests.gateway.commands.test_commands import run

POLICY = """\
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:8001/v1
    deployment: dedicated
    gpu_hour_usd: 0
    models: {demo: {context_tokens: 2048, capabilities: {tools: false, vision: false}}}
  shared:
    type: openai
    url: http://127.0.0.1:8002/v1
    models: {m: {input_usd_per_mtok: 1, output_usd_per_mtok: 2}}
routes:
  chat: {targets: [local/demo, shared/m]}
  local-first: {targets: [local/demo]}
tenants:
  acme: {allow: [chat]}
"""
TOOLS_REQUEST = {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "lookup"}}]}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    policy, request = tmp_path / "policy.yaml", tmp_path / "request.json"
    policy.write_text(POLICY)
    request.write_text(json.dumps(TOOLS_REQUEST))
    return policy, request


def test_explain_names_what_the_request_needs_and_the_capability_a_target_lacks(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, request = files
    code, out = run(["policy", "explain", str(policy), str(request)], capsys)
    assert code == 0
    assert "needs: tools" in out
    assert "local/demo" in out and "capability: tools" in out
    assert "chosen: shared/m" in out


def test_explain_says_why_a_route_the_tenant_may_not_use_does_not_exist(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, request = files
    request.write_text(json.dumps({**TOOLS_REQUEST, "model": "local-first"}))
    assert explain_file(str(policy), str(request), tenant="acme") == 1
    error = capsys.readouterr().err
    assert "access: tenant 'acme' may not use 'local-first' (its allow: chat)" in error


def test_explain_of_a_request_no_target_can_serve_shows_the_400(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, request = files
    request.write_text(json.dumps({**TOOLS_REQUEST, "model": "local-first"}))
    code, out = run(["policy", "explain", str(policy), str(request)], capsys)
    assert code == 0
    assert "rejected: 400 unsupported_parameter" in out


def test_check_warns_about_a_route_without_a_capability_another_route_has(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, _ = files
    code, out = run(["policy", "check", str(policy)], capsys)
    assert code == 0
    assert "no target of route `local-first` supports tools (route `chat` does)" in out
    assert "no target of route `local-first` supports vision" in out
    assert "route `chat` supports" not in out
