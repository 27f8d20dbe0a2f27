"""The `batches:` section's cross-field checks: a spill target is one of its route's
targets and on a shared backend; each error names its place in the file."""

from __future__ import annotations

import pytest

from policies import PolicyError, loads

POLICY = """version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:8001/v1
    deployment: dedicated
    gpu_hour_usd: 2.0
    models: {llama: {}}
  cloud:
    type: openai
    url: http://127.0.0.1:8002/v1
    models: {mini: {}, mini-batch: {}}
routes:
  chat: {targets: [local/llama, cloud/mini, cloud/mini-batch], objective: ordered}
batches:
  routes:
"""


def issue_of(batches_routes: str) -> tuple[str | None, str, int | None]:
    with pytest.raises(PolicyError) as caught:
        loads(POLICY + batches_routes, environ={})
    (issue,) = caught.value.issues
    return issue.field_path, issue.message, issue.line


def test_a_batch_priced_spill_target_of_the_route_is_accepted() -> None:
    policy = loads(POLICY + "    chat: {spill_to: [cloud/mini-batch]}\n", environ={})
    assert policy.file.batches.routes["chat"].spill_to == ["cloud/mini-batch"]


def test_a_spill_target_outside_the_route_is_refused_where_it_is_written() -> None:
    path, message, line = issue_of("    chat: {spill_to: [cloud/other]}\n")
    assert path == "batches.routes.chat.spill_to[0]" and line == 17
    assert "not a target of route `chat`" in message


def test_a_spill_target_on_dedicated_capacity_is_refused() -> None:
    path, message, _ = issue_of("    chat: {spill_to: [local/llama]}\n")
    assert path == "batches.routes.chat.spill_to[0]" and "not on a shared backend" in message


def test_batch_settings_for_a_route_that_does_not_exist_are_refused() -> None:
    path, message, _ = issue_of("    caht: {spill_to: []}\n")
    assert path == "batches.routes.caht" and "names no route" in message
