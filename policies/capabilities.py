"""What each model can do: its backend type's defaults, then what a launched backend
reports about itself, then what the policy file states (the file always wins).

A launched local backend reports at `GET /v1/models`, on each model card:

    {"id": "demo", ..., "capabilities": {"tools": false, "vision": false, ..., "n": 16},
     "max_model_len": 2048, "max_output_tokens": 2048,
     "prefill_tokens_per_s": 2400.0, "decode_tokens_per_s": 41.5}

The two rates are what it measured on itself after its warm-up: latency prediction
takes them instead of the policy's declared `priors` (which stand for a backend that
reports nothing), until live statistics of its own requests exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from policies.schema import Backend, Capabilities, ModelSpec

FLAGS: Final = ("tools", "vision", "json_mode", "json_schema", "logprobs", "audio")
# Reported rates outside this range (tokens per second) are taken as not reported: a
# rate near zero would predict an infinite time, and nothing serves faster than this.
RATE_RANGE: Final = (0.01, 1e9)


@dataclass(frozen=True, slots=True)
class ModelCapabilities:
    tools: bool = False
    vision: bool = False
    json_mode: bool = False
    json_schema: bool = False
    logprobs: bool = False
    audio: bool = False
    n: int | None = 1  # most choices per request; None: no limit
    context_tokens: int | None = None  # None: not known (not checked)
    max_output_tokens: int | None = None
    # measured by the backend itself (its warm-up); None: not reported
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None

    def names(self) -> frozenset[str]:
        """The flags it has (`tools`, `vision`, ...), and `n` when it allows several."""
        have = {name for name in FLAGS if getattr(self, name)}
        if self.n is None or self.n > 1:
            have.add("n")
        return frozenset(have)


# OpenAI's own API (and a compatible server not known to lack something) does everything.
OPENAI: Final = ModelCapabilities(True, True, True, True, True, True, None)
# What `gateway/upstream/chat_to_anthropic.py` carries to the Messages API: tools and
# image parts; `response_format`, logprobs and `n` > 1 have no counterpart.
ANTHROPIC: Final = ModelCapabilities(tools=True, vision=True)
# A launched local backend before it has reported: nothing beyond plain text (it is
# not served before it answers /health, and it reports right after).
LAUNCHED: Final = ModelCapabilities()


def type_default(backend: Backend) -> ModelCapabilities:
    if backend.launch is not None:
        return LAUNCHED
    return ANTHROPIC if backend.type == "anthropic" else OPENAI


def from_report(card: Mapping[str, Any]) -> ModelCapabilities | None:
    """A `/v1/models` card's self-description, or None when it gives none (a server
    that does not report keeps its type's defaults)."""
    reported = card.get("capabilities")
    if not isinstance(reported, Mapping):
        return None
    values: dict[str, Any] = {name: reported.get(name) is True for name in FLAGS}
    n = reported.get("n")
    values["n"] = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    for name, key in (("context_tokens", "max_model_len"),
                      ("max_output_tokens", "max_output_tokens")):
        value = card.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            values[name] = value
    for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        rate = card.get(name)
        if isinstance(rate, int | float) and not isinstance(rate, bool) \
                and RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
            values[name] = float(rate)
    return ModelCapabilities(**values)


_STATED: Final = tuple(Capabilities.model_fields)  # what a policy file may state


def resolve(backend: Backend, spec: ModelSpec,
            reported: ModelCapabilities | None = None) -> ModelCapabilities:
    """The model's capabilities: defaults < report < the policy file."""
    base = reported or type_default(backend)
    stated = spec.capabilities
    overrides: dict[str, Any] = {name: getattr(stated, name) for name in _STATED
                                 if getattr(stated, name) is not None}
    if spec.context_tokens is not None:
        overrides["context_tokens"] = spec.context_tokens
    if spec.max_output_tokens is not None:
        overrides["max_output_tokens"] = spec.max_output_tokens
    return replace(base, **overrides) if overrides else base
