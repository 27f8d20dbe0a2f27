"""The tokens a backend says a request used: one reading of its `usage` object.

OpenAI's chat and completions APIs say `prompt_tokens` / `completion_tokens`; the
Responses API and Anthropic's Messages API say `input_tokens` / `output_tokens`, and
Anthropic counts the prompt tokens read from or written to its cache apart
(`cache_read_input_tokens`, `cache_creation_input_tokens`): they are input the model
processed, so they count as input here. A count that is absent or not an integer is
not reported (None); 0 is a count like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ANTHROPIC_CACHED_INPUT = ("cache_read_input_tokens", "cache_creation_input_tokens")


def _count(usage: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def reported_tokens(usage: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(input, output) tokens as reported; None where the usage does not say."""
    tokens_in = _count(usage, "prompt_tokens", "input_tokens")
    if tokens_in is not None and "prompt_tokens" not in usage:
        tokens_in += sum(_count(usage, name) or 0 for name in _ANTHROPIC_CACHED_INPUT)
    return tokens_in, _count(usage, "completion_tokens", "output_tokens")


def cached_tokens(usage: Mapping[str, Any]) -> int | None:
    """Prompt tokens the backend read from its prefix cache: OpenAI's (and vLLM's, the
    local backend's) `prompt_tokens_details.cached_tokens`, Anthropic's
    `cache_read_input_tokens`; None where the usage does not say."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        return _count(details, "cached_tokens")
    return _count(usage, "cache_read_input_tokens")
