"""Prompt and cached tokens per backend and replica, counted from finished records."""

from __future__ import annotations

from gateway.core.record import AttemptRecord, RequestRecord
from gateway.telemetry import prompt_tokens
from gateway.telemetry.prompt_tokens import PromptTokens


def _record(backend: str, replica: str | None, tokens: int | None, cached: int | None, *,
            answered: bool = True) -> RequestRecord:
    record = RequestRecord(request_id="r", method="POST", path="/v1/chat/completions")
    attempt = AttemptRecord(key=f"{backend}/m", backend=backend, model="m",
                            upstream_model="m", system="openai", number=1, ended=True,
                            error=None if answered else "Backend failed.")
    attempt.replica = replica
    record.attempts.append(attempt)
    record.input_tokens, record.cached_input_tokens = tokens, cached
    return record


def test_answered_requests_count_their_prompt_and_cached_tokens_per_replica() -> None:
    counted = PromptTokens()
    counted.observe(_record("local", "10.0.0.1:8001", 1000, 900))
    counted.observe(_record("local", "10.0.0.1:8001", 1000, 0))
    counted.observe(_record("cloud", None, 50, None))
    assert counted.counts == {("local", "10.0.0.1:8001"): [2, 2000, 900],
                              ("cloud", ""): [1, 50, 0]}


def test_a_failed_or_unreported_request_counts_nothing() -> None:
    counted = PromptTokens()
    counted.observe(_record("local", None, 1000, 900, answered=False))
    counted.observe(_record("local", None, None, None))
    assert counted.counts == {}


def test_the_table_is_pruned_when_full(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(prompt_tokens, "MAX_SERIES", 2)
    counted = PromptTokens()
    counted.prune = lambda counts: counts.pop(("local", "gone:1"))
    counted.observe(_record("local", "gone:1", 10, 0))
    counted.observe(_record("local", "kept:1", 10, 0))
    counted.observe(_record("local", "new:1", 10, 0))
    assert set(counted.counts) == {("local", "kept:1"), ("local", "new:1")}
