"""Anthropic Messages API requests served through the chat pipeline, and back. Pure.

    chat_request(messages body)        → a chat-completions body (what the pipeline routes)
    message(chat.completion)           → a Messages API `message`
    error_body(status, message, id)    → Anthropic's `{"type": "error", "error": {...}}`
    EventEncoder.feed(SSE bytes)       ← `chat.completion.chunk` SSE, as Messages events
                                         (`message_start` ... `message_stop`)

A request is checked for what the Messages API requires (`max_tokens`, user/assistant
roles) so that a client gets the error Anthropic would give; `top_k` and `thinking`
have no chat-completions counterpart and are dropped.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.api.chunk_reader import ChunkReader
from gateway.core.errors import BadRequest

Body = dict[str, Any]

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "function_call": "tool_use", "content_filter": "refusal"}

# HTTP status → Anthropic error type (the SDKs pick their exception by status).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}


# -- request -------------------------------------------------------------------------

def _invalid(message: str, param: str) -> BadRequest:
    return BadRequest(f"{param}: {message}", param=param)


def _text(content: Any, param: str) -> str:
    """A system prompt or tool result: a string or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content
                       if isinstance(block, dict) and block.get("type") == "text")
    if content is None:
        return ""
    raise _invalid("Input should be a string or a list of text blocks", param)


def _image_part(block: Body, param: str) -> Body:
    source = block.get("source")
    source = source if isinstance(source, dict) else {}  # a string: refused below
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise _invalid("image source must be base64 or url", param)
    return {"type": "image_url", "image_url": {"url": url}}


def _messages_of(turn: Body, param: str) -> list[Body]:
    """One Messages API turn → chat messages (tool results become `tool` messages)."""
    role = turn.get("role")
    if role not in ("user", "assistant"):
        raise _invalid("Input should be 'user' or 'assistant'", f"{param}.role")
    content = turn.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _invalid("Input should be a string or a list of content blocks",
                       f"{param}.content")
    parts: list[Body] = []
    tool_calls: list[Body] = []
    tool_results: list[Body] = []
    for index, block in enumerate(content):
        where = f"{param}.content.{index}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append(_image_part(block, where))
        elif kind == "tool_use" and role == "assistant":
            tool_calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"),
                "arguments": orjson.dumps(block.get("input") or {}).decode()}})
        elif kind == "tool_result" and role == "user":
            tool_results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                 "content": _text(block.get("content"), where)})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the model's own reasoning, which a chat backend cannot take back
        else:
            raise _invalid(f"content blocks of type {kind!r} are not supported here", where)
    messages = tool_results
    if parts or tool_calls or not tool_results:
        if len(parts) == 1 and parts[0]["type"] == "text":
            text: Any = parts[0]["text"]
        else:
            text = parts or ("" if not tool_calls else None)
        message: Body = {"role": role, "content": text}
        if tool_calls:
            message["tool_calls"] = tool_calls
        messages = [*messages, message]
    return messages


def _tools(tools: Any) -> list[Body]:
    if not isinstance(tools, list):
        raise _invalid("Input should be a list", "tools")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _invalid("Input should be an object", f"tools.{index}")
        function: Body = {"name": tool.get("name"),
                          "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if mapped is None:
        raise _invalid("Input should be auto, any, tool or none", "tool_choice")
    return mapped


def chat_request(body: Body, *, counting: bool = False) -> Body:
    """A Messages API request → a chat-completions request. `counting`: for
    `/v1/messages/count_tokens`, where `max_tokens` is not required."""
    max_tokens = body.get("max_tokens")
    if not counting and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                         or max_tokens < 1):
        raise _invalid("Field required (a positive integer)", "max_tokens")
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise _invalid("Field required (a non-empty list)", "messages")
    messages: list[Body] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system, "system")})
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise _invalid("Input should be an object", f"messages.{index}")
        messages.extend(_messages_of(turn, f"messages.{index}"))
    chat: Body = {"model": body.get("model"), "messages": messages}
    if not counting:
        chat["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # Messages streams always report it
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _invalid("Input should be an object", "metadata")
    user = (metadata or {}).get("user_id")
    if isinstance(user, str):
        chat["user"] = user
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        choice = body["tool_choice"]
        chat["tool_choice"] = _tool_choice(choice)
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    return chat


# -- response ------------------------------------------------------------------------

def stop_reason(finish_reason: Any) -> str | None:
    return None if finish_reason is None else STOP_REASONS.get(finish_reason, "end_turn")


def anthropic_usage(usage: Any) -> Body:
    usage = usage if isinstance(usage, dict) else {}
    return {"input_tokens": usage.get("prompt_tokens") or 0,
            "output_tokens": usage.get("completion_tokens") or 0}


def message(completion: Body) -> Body:
    """A `chat.completion` → a Messages API `message` (its first choice)."""
    choice = (completion.get("choices") or [{}])[0]
    reply = choice.get("message") or {}
    content: list[Body] = []
    text = reply.get("content")
    calls = reply.get("tool_calls") or []
    if text or not calls:
        content.append({"type": "text", "text": text or ""})
    for call in calls:
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {}  # a model's malformed arguments: an empty input, not a 500
        content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                        "input": arguments})
    return {"id": completion.get("id", ""), "type": "message", "role": "assistant",
            "model": completion.get("model", ""), "content": content,
            "stop_reason": stop_reason(choice.get("finish_reason")) or "end_turn",
            "stop_sequence": None, "usage": anthropic_usage(completion.get("usage"))}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str, request_id: str | None = None) -> Body:
    body: Body = {"type": "error", "error": {"type": error_type(status), "message": message}}
    if request_id:
        body["request_id"] = request_id
    return body


def openai_error_message(data: bytes) -> str | None:
    """The `error.message` of OpenAI's error JSON, if that is what `data` is."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    message_ = error.get("message") if isinstance(error, dict) else None
    return message_ if isinstance(message_, str) else None


def sse(kind: str, data: Body) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class EventEncoder(ChunkReader):
    """`chat.completion.chunk` SSE → Messages API events, one write at a time.

    The pipeline hands it complete events (and `: comments`, passed through). Usage
    arrives in the last chunk, so `message_start` reports 0 input tokens and the
    final `message_delta` carries both counts (the SDKs take them from there).
    """

    def __init__(self) -> None:
        self.started = False
        self.stop_reason: str | None = None
        self.usage: Body = {}
        self._block: int | None = None  # the open content block's index
        self._next = 0
        self._tool_blocks: dict[int, int] = {}  # chat tool_calls index → block index

    def _chunk(self, chunk: Body) -> bytes:
        if isinstance(chunk.get("error"), dict):
            error = chunk["error"]
            status = 529 if error.get("code") == "overloaded" else 500
            return sse("error", error_body(status, str(error.get("message", ""))))
        out = []
        if not self.started:
            self.started = True
            out.append(sse("message_start", {"type": "message_start", "message": {
                "id": chunk.get("id", ""), "type": "message", "role": "assistant",
                "model": chunk.get("model", ""), "content": [], "stop_reason": None,
                "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}}))
        if isinstance(chunk.get("usage"), dict):
            self.usage = anthropic_usage(chunk["usage"])
        for choice in (chunk.get("choices") or [])[:1]:
            out.extend(self._delta(choice.get("delta") or {}))
            if choice.get("finish_reason"):
                self.stop_reason = stop_reason(choice["finish_reason"])
                out.append(self._close())
        return b"".join(out)

    def _open(self, block: Body) -> bytes:
        closed = self._close()
        self._block, self._next = self._next, self._next + 1
        return closed + sse("content_block_start", {"type": "content_block_start",
                                                    "index": self._block,
                                                    "content_block": block})

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        index, self._block = self._block, None
        return sse("content_block_stop", {"type": "content_block_stop", "index": index})

    def _delta(self, delta: Body) -> list[bytes]:
        out = []
        text = delta.get("content")
        if text:
            if self._block is None or self._block in self._tool_blocks.values():
                out.append(self._open({"type": "text", "text": ""}))
            out.append(sse("content_block_delta", {"type": "content_block_delta",
                                                   "index": self._block,
                                                   "delta": {"type": "text_delta",
                                                             "text": text}}))
        for call in delta.get("tool_calls") or ():
            position = call.get("index", 0)
            function = call.get("function") or {}
            if position not in self._tool_blocks:
                out.append(self._open({"type": "tool_use", "id": call.get("id"),
                                       "name": function.get("name"), "input": {}}))
                self._tool_blocks[position] = self._next - 1  # the block just opened
            if function.get("arguments"):
                out.append(sse("content_block_delta", {
                    "type": "content_block_delta", "index": self._tool_blocks[position],
                    "delta": {"type": "input_json_delta",
                              "partial_json": function["arguments"]}}))
        return out

    def _finish(self) -> bytes:
        return (self._close()
                + sse("message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": self.stop_reason or "end_turn",
                                                  "stop_sequence": None},
                                        "usage": self.usage or anthropic_usage(None)})
                + sse("message_stop", {"type": "message_stop"}))
