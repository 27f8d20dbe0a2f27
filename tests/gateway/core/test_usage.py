"""One reading of a backend's `usage`: limits, the ledger, routing statistics and the
record all take their token counts from `reported_tokens`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.usage import reported_tokens


def test_openai_names() -> None:
    assert reported_tokens({"prompt_tokens": 12, "completion_tokens": 3,
                            "total_tokens": 15}) == (12, 3)


def test_responses_and_anthropic_names() -> None:
    assert reported_tokens({"input_tokens": 7, "output_tokens": 2}) == (7, 2)


def test_a_count_of_zero_is_a_count_not_a_missing_one() -> None:
    assert reported_tokens({"completion_tokens": 0, "output_tokens": 9}) == (None, 0)
    assert reported_tokens({"prompt_tokens": 0, "completion_tokens": 0}) == (0, 0)


def test_anthropics_cache_reads_and_writes_are_input_the_model_processed() -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 1000,
             "cache_creation_input_tokens": 50, "output_tokens": 4}
    assert reported_tokens(usage) == (1060, 4)


@pytest.mark.parametrize("bad", [None, "12", 1.5, True, -3, [], {}])
def test_what_is_not_a_count_is_not_reported(bad: Any) -> None:
    assert reported_tokens({"prompt_tokens": bad, "completion_tokens": bad}) == (None, None)


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens", "input_tokens",
                                        "output_tokens", "cache_read_input_tokens", "other"]),
                       st.one_of(st.integers(-5, 10**9), st.none(), st.text(max_size=3),
                                 st.booleans(), st.floats(allow_nan=True))))
def test_any_usage_object_reads_as_counts_or_none(usage: dict[str, Any]) -> None:
    tokens_in, tokens_out = reported_tokens(usage)
    for count in (tokens_in, tokens_out):
        assert count is None or (type(count) is int and count >= 0)
