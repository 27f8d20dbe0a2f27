"""Checks on the fields the gateway relies on, each failure a 400 naming the `param`.

Only what the gateway itself needs, or what would otherwise surface as a confusing
upstream error, is checked; unknown fields pass through untouched so new provider
parameters work without a gateway release. Written by hand rather than with pydantic:
this runs on every request and must cost microseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.core.errors import BadRequest, wrong_type

Body = dict[str, Any]

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_int(body: Body, param: str, minimum: int) -> None:
    value = body.get(param)
    if value is None:
        return
    if not _is_int(value):
        raise wrong_type(param, "an integer", value)
    if value < minimum:
        raise BadRequest(f"Invalid '{param}': {value} is less than the minimum of {minimum}.",
                         param=param, code="invalid_value")


def _check_number(body: Body, param: str, low: float, high: float) -> None:
    value = body.get(param)
    if value is None:
        return
    if not _is_number(value):
        raise wrong_type(param, "a number", value)
    if not low <= value <= high:
        raise BadRequest(f"Invalid '{param}': {value} is outside [{low}, {high}].",
                         param=param, code="invalid_value")


def _check_stream(body: Body) -> None:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise wrong_type("stream", "a boolean", stream)
    options = body.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise wrong_type("stream_options", "an object", options)
    if not stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true.",
                         param="stream_options", code="invalid_value")
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise wrong_type("stream_options.include_usage", "a boolean", include)


# The sampling parameters `_check_sampling` reads; a body naming none is skipped at once.
_INTS = (("max_tokens", 1), ("max_completion_tokens", 1), ("n", 1))
_NUMBERS = (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0), ("presence_penalty", -2.0, 2.0),
            ("frequency_penalty", -2.0, 2.0))
_SAMPLING = frozenset([*(name for name, _ in _INTS), *(name for name, _, _ in _NUMBERS),
                       "seed", "stop", "user"])


def _check_sampling(body: Body) -> None:
    present = body.keys() & _SAMPLING
    if not present:
        return
    for param, minimum in _INTS:
        if param in present:
            _check_int(body, param, minimum)
    for param, low, high in _NUMBERS:
        if param in present:
            _check_number(body, param, low, high)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise wrong_type("seed", "an integer", seed)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise wrong_type("stop", "a string or an array of strings", stop)
        if len(stop) > 4:
            raise BadRequest("'stop' takes at most 4 sequences.", param="stop",
                             code="invalid_value")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise wrong_type("user", "a string", user)


def _check_content(param: str, content: object, role: str) -> None:
    if isinstance(content, str):
        return
    if content is None:
        if role in ("assistant", "function"):  # an assistant turn may carry only tool calls
            return
        raise BadRequest(f"'{param}' is required for role '{role}'.", param=param,
                         code="missing_required_parameter")
    if not isinstance(content, list):
        raise wrong_type(param, "a string or an array of content parts", content)
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise BadRequest(f"'{param}[{index}]' must be an object with a string 'type'.",
                             param=f"{param}[{index}]", code="invalid_type")


def check_chat(body: Body) -> None:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("Missing required parameter: 'messages'.", param="messages",
                         code="missing_required_parameter")
    if not isinstance(messages, list):
        raise wrong_type("messages", "an array", messages)
    if not messages:
        raise BadRequest("'messages' must contain at least one message.", param="messages",
                         code="invalid_value")
    for index, message in enumerate(messages):
        # The usual message, a known role and text content, costs no string formatting.
        if isinstance(message, dict):
            role = message.get("role")
            if isinstance(role, str) and role in CHAT_ROLES and \
                    isinstance(message.get("content"), str):
                continue
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise wrong_type(where, "an object", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise (BadRequest(f"Missing required parameter: '{where}.role'.",
                              param=f"{where}.role", code="missing_required_parameter")
                   if role is None else wrong_type(f"{where}.role", "a string", role))
        if role not in CHAT_ROLES:
            raise BadRequest(f"Invalid value for '{where}.role': {role!r}; expected one of "
                             f"{', '.join(sorted(CHAT_ROLES))}.", param=f"{where}.role",
                             code="invalid_value")
        _check_content(f"{where}.content", message.get("content"), role)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise wrong_type("tools", "an array", tools)
    _check_stream(body)
    _check_sampling(body)


def _is_token_list(value: list[Any]) -> bool:
    return all(_is_int(token) for token in value)


def _check_text_input(param: str, value: object) -> None:
    """A string, an array of strings, an array of token ids or an array of such arrays."""
    if value is None:
        raise BadRequest(f"Missing required parameter: '{param}'.", param=param,
                         code="missing_required_parameter")
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise wrong_type(param, "a string or an array", value)
    if not value:
        raise BadRequest(f"'{param}' must not be empty.", param=param, code="invalid_value")
    if all(isinstance(item, str) for item in value) or _is_token_list(value):
        return
    if all(isinstance(item, list) and item and _is_token_list(item) for item in value):
        return
    raise BadRequest(f"Invalid '{param}': expected a string, an array of strings, an array of "
                     "token ids or an array of token-id arrays.", param=param,
                     code="invalid_type")


def check_completions(body: Body) -> None:
    _check_text_input("prompt", body.get("prompt"))
    _check_stream(body)
    _check_sampling(body)


def check_embeddings(body: Body) -> None:
    _check_text_input("input", body.get("input"))
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'.",
                         param="encoding_format", code="invalid_value")
    if body.get("stream"):
        raise BadRequest("Embeddings cannot be streamed.", param="stream", code="invalid_value")
    _check_int(body, "dimensions", 1)


Checker = Callable[[Body], None]
