"""OpenAI chat completions ⇄ Anthropic Messages, for `type: anthropic` backends. Pure.

    messages_request(chat body)            → the Messages API request body
    chat_completion(message, created)      ← a Messages API response (JSON)
    openai_error(status, anthropic body)   ← an Anthropic error body, as OpenAI's error JSON
    ChunkTranslator.feed(SSE bytes)        ← Messages API events, as `chat.completion.chunk`
                                             SSE (`data: [DONE]` after `message_stop`)

What has no counterpart is dropped rather than guessed: `n` > 1 is refused (one
choice per Messages call), penalties, `seed` and `logprobs` are not sent.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.errors import BadRequest

Body = dict[str, Any]

# Anthropic requires `max_tokens`; OpenAI's default is "up to the context window".
# 4096 is the largest output every current Claude model accepts.
DEFAULT_MAX_TOKENS = 4096
ANTHROPIC_TEMPERATURE_MAX = 1.0  # OpenAI allows up to 2.0; higher values are clamped

FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "pause_turn": "stop", "refusal": "content_filter",
                  "model_context_window_exceeded": "length"}

# Anthropic error type → OpenAI (type, code): what an OpenAI SDK expects to see.
ERROR_TYPES = {
    "invalid_request_error": ("invalid_request_error", None),
    "authentication_error": ("authentication_error", "invalid_api_key"),
    "permission_error": ("permission_error", None),
    "not_found_error": ("invalid_request_error", "not_found"),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit_error": ("rate_limit_error", "rate_limit_exceeded"),
    "api_error": ("server_error", None),
    "overloaded_error": ("server_error", "overloaded"),
}


# -- request -------------------------------------------------------------------------

def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and part.get("type") == "text")
    return ""


def _image_block(part: Body) -> Body:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise BadRequest("An image_url part needs a url.", param="messages")
    if url.startswith("data:"):  # data:image/png;base64,....
        header, _, data = url.partition(",")
        media_type = header[5:].split(";")[0]
        return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                            "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _blocks(content: Any) -> list[Body]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif kind == "image_url":
            blocks.append(_image_block(part))
        else:
            raise BadRequest(f"Content parts of type '{kind}' cannot be sent to an Anthropic "
                             "backend.", param="messages")
    return blocks


def _tool_use_blocks(message: Body) -> list[Body]:
    blocks = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise BadRequest("A tool call must be an object with a 'function' object.",
                             param="messages")
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError as exc:
            raise BadRequest("A tool call's arguments must be a JSON object.",
                             param="messages") from exc
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                       "input": arguments})
    return blocks


def _turns(messages: list[Body]) -> tuple[list[str], list[Body]]:
    """System texts, and user/assistant turns with consecutive same-role turns merged
    (Anthropic alternates roles; tool results travel in a user turn)."""
    system: list[str] = []
    turns: list[Body] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text_of(message.get("content")))
            continue
        if role == "tool":
            role, blocks = "user", [{"type": "tool_result",
                                     "tool_use_id": message.get("tool_call_id"),
                                     "content": _text_of(message.get("content"))}]
        elif role == "assistant":
            blocks = _blocks(message.get("content")) + _tool_use_blocks(message)
        elif role == "user":
            blocks = _blocks(message.get("content"))
        else:
            raise BadRequest(f"Messages with role '{role}' cannot be sent to an Anthropic "
                             "backend.", param="messages")
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def _tools(body: Body) -> list[Body]:
    tools = []
    for tool in body.get("tools") or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise BadRequest("Only function tools can be sent to an Anthropic backend.",
                             param="tools")
        entry: Body = {"name": function.get("name"),
                       "input_schema": function.get("parameters") or {"type": "object"}}
        if function.get("description"):
            entry["description"] = function["description"]
        tools.append(entry)
    return tools


def _tool_choice(choice: Any) -> Body | None:
    if choice is None:
        return None
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "tool", "name": choice["function"].get("name")}
    raise BadRequest("Unsupported 'tool_choice' for an Anthropic backend.", param="tool_choice")


def messages_request(body: Body) -> Body:
    """A validated chat-completions body → a Messages API body (the model name as given:
    the pipeline has already put the backend's upstream name in it)."""
    if (body.get("n") or 1) > 1:
        raise BadRequest("Anthropic backends return one choice per request; 'n' must be 1.",
                         param="n")
    system, turns = _turns(body["messages"])
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    out: Body = {"model": body["model"], "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
                 "messages": turns}
    if system:
        out["system"] = "\n\n".join(system)
    temperature = body.get("temperature")
    if temperature is not None:
        out["temperature"] = min(temperature, ANTHROPIC_TEMPERATURE_MAX)
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if body.get("stream"):
        out["stream"] = True
    if isinstance(body.get("user"), str):
        out["metadata"] = {"user_id": body["user"]}
    tools = _tools(body)
    if tools:
        out["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        out["tool_choice"] = choice
    return out


# -- response ------------------------------------------------------------------------

def chat_usage(usage: Any) -> Body:
    """Anthropic usage → OpenAI usage. Cache reads and writes are input tokens too."""
    usage = usage if isinstance(usage, dict) else {}
    cached = usage.get("cache_read_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + cached + (
        usage.get("cache_creation_input_tokens") or 0)
    completion = usage.get("output_tokens") or 0
    out: Body = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def finish_reason(stop_reason: Any) -> str | None:
    return None if stop_reason is None else FINISH_REASONS.get(stop_reason, "stop")


def chat_completion(message: Body, created: int) -> Body:
    """A Messages API response → a `chat.completion`."""
    text = []
    tool_calls = []
    for block in message.get("content") or ():
        if block.get("type") == "text":
            text.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            tool_calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"),
                "arguments": orjson.dumps(block.get("input") or {}).decode()}})
    reply: Body = {"role": "assistant", "content": "".join(text) if text or not tool_calls
                   else None, "refusal": None}
    if tool_calls:
        reply["tool_calls"] = tool_calls
    return {"id": message.get("id", ""), "object": "chat.completion", "created": created,
            "model": message.get("model", ""),
            "choices": [{"index": 0, "message": reply, "logprobs": None,
                         "finish_reason": finish_reason(message.get("stop_reason")) or "stop"}],
            "usage": chat_usage(message.get("usage"))}


def openai_error(status: int, body: Any) -> Body:
    """An Anthropic error body (`{"type": "error", "error": {"type", "message"}}`) →
    OpenAI's error JSON; anything else becomes a message naming the status."""
    error = body.get("error") if isinstance(body, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    openai_type, code = ERROR_TYPES.get(kind or "", (
        "invalid_request_error" if status < 500 else "server_error", None))
    return {"error": {"message": message if isinstance(message, str)
                      else f"Anthropic backend returned HTTP {status}.",
                      "type": openai_type, "code": code or kind, "param": None}}


class StreamError(ValueError):
    """The Messages stream was malformed, or reported an error before any output."""


class ChunkTranslator:
    """Messages API SSE → `chat.completion.chunk` SSE, one network read at a time.

    Complete events are translated as they arrive; an incomplete one waits for the
    next read. `include_usage`: emit OpenAI's usage-only chunk before `[DONE]`.
    """

    def __init__(self, *, created: int, include_usage: bool) -> None:
        self.created = created
        self.include_usage = include_usage
        self.id = ""
        self.model = ""
        self.usage: Body = {}
        self.finish: str | None = None
        self.emitted = False  # some chunk has been produced
        self.done = False  # `message_stop` seen
        self._pending = b""
        self._tool_index: dict[int, int] = {}  # content block index → tool_calls index

    def feed(self, data: bytes) -> bytes:
        data = self._pending + data
        if b"\r" in data:  # after joining: a read may end between the \r and the \n
            data = data.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        start = 0
        while (end := data.find(b"\n\n", start)) >= 0:
            out.extend(self._event(data[start:end]))
            start = end + 2
        self._pending = data[start:]
        if out:
            self.emitted = True
        return b"".join(out)

    def _chunk(self, delta: Body, finish: str | None = None) -> bytes:
        return b"data: " + orjson.dumps({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                              "finish_reason": finish}]}) + b"\n\n"

    def _event(self, raw: bytes) -> list[bytes]:
        payload = b"".join(line[5:].strip() for line in raw.split(b"\n")
                           if line.startswith(b"data:"))
        if not payload:
            return []  # a comment, or an `event:` line alone
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise StreamError(f"an undecodable event from the backend ({len(payload)} bytes)"
                              ) from exc
        if not isinstance(event, dict):
            raise StreamError("an event that is not a JSON object")
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.id, self.model = message.get("id", ""), message.get("model", "")
            self.usage.update(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": "", "refusal": None})]
        if kind == "content_block_start":
            return self._block_start(event)
        if kind == "content_block_delta":
            return self._block_delta(event)
        if kind == "message_delta":
            usage = event.get("usage") or {}
            # cumulative counts; a missing one keeps its message_start value
            self.usage.update({k: v for k, v in usage.items() if v is not None})
            self.finish = finish_reason((event.get("delta") or {}).get("stop_reason"))
            return [self._chunk({}, self.finish or "stop")]
        if kind == "message_stop":
            self.done = True
            tail = []
            if self.include_usage:
                tail.append(b"data: " + orjson.dumps({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model, "choices": [],
                    "usage": chat_usage(self.usage)}) + b"\n\n")
            return [*tail, b"data: [DONE]\n\n"]
        if kind == "error":
            body = openai_error(500, event)
            if not self.emitted:
                raise StreamError(body["error"]["message"])
            return [b"data: " + orjson.dumps(body) + b"\n\n"]
        return []  # ping, content_block_stop, and event types added later

    def _block_start(self, event: Body) -> list[bytes]:
        block = event.get("content_block") or {}
        if block.get("type") == "tool_use":
            index = self._tool_index[event.get("index", 0)] = len(self._tool_index)
            return [self._chunk({"tool_calls": [{
                "index": index, "id": block.get("id"), "type": "function",
                "function": {"name": block.get("name"), "arguments": ""}}]})]
        if block.get("type") == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        return []

    def _block_delta(self, event: Body) -> list[bytes]:
        delta = event.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            return [self._chunk({"content": delta.get("text", "")})]
        if kind == "input_json_delta":
            index = self._tool_index.get(event.get("index", 0))
            if index is not None:
                return [self._chunk({"tool_calls": [{
                    "index": index, "function": {"arguments": delta.get("partial_json", "")}}]})]
        return []  # thinking and signature deltas have no chat-completions counterpart
