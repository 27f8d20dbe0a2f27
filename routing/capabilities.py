"""Capabilities as bit masks: what a request needs (read once from its parsed body) and
what each target lacks, so the routing filter is one AND per candidate.

A target's capabilities come from `policies.capabilities.resolve` (type defaults <
what a launched backend reports < the policy file), less what a backend has since
answered it cannot do (`Learned`, kept until the policy reloads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from policies.capabilities import FLAGS, ModelCapabilities

TOOLS: Final = 1
VISION: Final = 2
JSON_MODE: Final = 4
JSON_SCHEMA: Final = 8
LOGPROBS: Final = 16
AUDIO: Final = 32
BIT: Final = dict(zip(FLAGS, (TOOLS, VISION, JSON_MODE, JSON_SCHEMA, LOGPROBS, AUDIO),
                      strict=True))
ALL: Final = sum(BIT.values())
NAME: Final = {bit: name for name, bit in BIT.items()}
# The request field a client changes to do without the capability (the 400's `param`).
PARAM: Final = {TOOLS: "tools", VISION: "messages", JSON_MODE: "response_format",
                JSON_SCHEMA: "response_format", LOGPROBS: "logprobs", AUDIO: "messages"}
# Exclusion reasons (decision, explain, span): `capability: tools`, ...
REASON_PREFIX: Final = "capability: "
REASON: Final = {bit: REASON_PREFIX + name for bit, name in NAME.items()}
REASON_CHOICES: Final = REASON_PREFIX + "n"
REASON_MAX_OUTPUT: Final = REASON_PREFIX + "max_output_tokens"

# Body fields that can need a capability; a body with none of them (and only text
# messages) needs nothing, and is told so without further reading.
_NEED_FIELDS: Final = frozenset({"tools", "tool_choice", "functions", "function_call",
                                 "response_format", "logprobs", "top_logprobs", "audio",
                                 "modalities"})
_PART_NEEDS: Final = {"image_url": VISION, "input_image": VISION, "image": VISION,
                      "input_audio": AUDIO}


def mask_of(capabilities: ModelCapabilities) -> int:
    return sum(bit for name, bit in BIT.items() if getattr(capabilities, name))


def lowest(bits: int) -> int:
    return bits & -bits


def names_of(bits: int) -> list[str]:
    return [name for bit, name in NAME.items() if bits & bit]


def needs_of(body: Mapping[str, Any]) -> int:
    """The capability bits a parsed OpenAI request body needs."""
    needs = 0
    if not body.keys().isdisjoint(_NEED_FIELDS):
        if body.get("tools") or body.get("functions") or \
                body.get("tool_choice") not in (None, "none") or \
                body.get("function_call") not in (None, "none"):
            needs |= TOOLS
        response_format = body.get("response_format")
        if isinstance(response_format, Mapping):
            kind = response_format.get("type")
            needs |= JSON_MODE if kind == "json_object" else \
                JSON_SCHEMA if kind == "json_schema" else 0
        logprobs = body.get("logprobs")
        if (logprobs is not None and logprobs is not False) or body.get("top_logprobs"):
            needs |= LOGPROBS
        modalities = body.get("modalities")
        if body.get("audio") is not None or (
                isinstance(modalities, list) and "audio" in modalities):
            needs |= AUDIO
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                for part in content:
                    if isinstance(part, dict):
                        needs |= _PART_NEEDS.get(part.get("type"), 0)  # type: ignore[arg-type]
    return needs


_PARAM_BITS: Final = {"tools": TOOLS, "tool_choice": TOOLS, "functions": TOOLS,
                      "function_call": TOOLS, "parallel_tool_calls": TOOLS,
                      "response_format": JSON_MODE | JSON_SCHEMA, "logprobs": LOGPROBS,
                      "top_logprobs": LOGPROBS, "audio": AUDIO, "modalities": AUDIO,
                      "messages": VISION | AUDIO}


def bits_for_param(param: str | None) -> int:
    """The capabilities a backend's refusal naming `param` may be about (the caller
    keeps those the request needed): `messages[0].content[1]` is an image or audio part."""
    if param is None:
        return 0
    return _PARAM_BITS.get(param.partition("[")[0].partition(".")[0], 0)


def choices_of(body: Mapping[str, Any]) -> int:
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


@dataclass
class Learned:
    """What backends answered they cannot do, per target, since the policy loaded: the
    capabilities they lack and the smallest context they overflowed."""

    lacks: dict[str, int] = field(default_factory=dict)
    context_below: dict[str, int] = field(default_factory=dict)  # tokens that did not fit

    def lack(self, key: str, bits: int) -> bool:
        """Record it; False when it was known already (nothing to recompile)."""
        before = self.lacks.get(key, 0)
        self.lacks[key] = before | bits
        return before | bits != before

    def overflowed(self, key: str, tokens: int) -> bool:
        before = self.context_below.get(key)
        if before is not None and before <= tokens:
            return False
        self.context_below[key] = tokens
        return True

    def applied(self, key: str, capabilities: ModelCapabilities,
                ) -> tuple[ModelCapabilities, int]:
        """(capabilities with the learned context limit, bits learned missing)."""
        below = self.context_below.get(key)
        if below is not None:
            limit = below - 1
            if capabilities.context_tokens is None or capabilities.context_tokens > limit:
                capabilities = replace(capabilities, context_tokens=max(limit, 1))
        return capabilities, self.lacks.get(key, 0)
