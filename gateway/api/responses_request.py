"""OpenAI Responses API requests as chat-completions requests. Pure.

    input_items(body)                  → the request's `input` as a list of items
    chat_request(body, history)        → (chat body, fields chat cannot carry)

`history` is the conversation a `previous_response_id` names (its input and output
items, oldest first); the new input follows it. Fields a chat backend cannot carry
(built-in tools, `include`, `background`, ...) are not refused here: a backend that
speaks the Responses API natively takes them as they are, and only a translation to
chat refuses them, naming the field (`untranslatable`).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.errors import BadRequest

Body = dict[str, Any]

# Passed to chat as they are, with the same meaning in both APIs.
_SAME = ("temperature", "top_p", "parallel_tool_calls", "user", "service_tier",
         "safety_identifier", "prompt_cache_key")
# Responses-only fields the gateway handles itself or that change nothing for chat.
_GATEWAY_OWN = frozenset({"model", "input", "instructions", "tools", "tool_choice",
                          "max_output_tokens", "text", "stream", "store", "metadata",
                          "previous_response_id", "reasoning", "truncation", "stream_options",
                          *_SAME})
_ROLES = ("user", "assistant", "system", "developer")


def invalid(message: str, param: str) -> BadRequest:
    return BadRequest(f"{param}: {message}", param=param)


def input_items(body: Body) -> list[Body]:
    """`input` as items: a string is one user message."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise invalid("Input should be an object", f"input[{index}]")
        return value
    if value is None:
        raise invalid("Field required (a string or a list of items)", "input")
    raise invalid("Input should be a string or a list of items", "input")


def untranslatable(body: Body) -> list[str]:
    """The fields of `body` that a chat-completions backend cannot carry."""
    fields = [name for name, value in body.items()
              if name not in _GATEWAY_OWN and value not in (None, False, [], {})]
    for index, tool in enumerate(body.get("tools") or ()):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            fields.append(f"tools[{index}].type")
    if body.get("truncation") not in (None, "disabled"):
        fields.append("truncation")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and any(reasoning.get(name) for name in ("summary",
                                                                            "generate_summary")):
        fields.append("reasoning.summary")
    text = body.get("text")
    if isinstance(text, dict) and text.get("verbosity"):
        fields.append("text.verbosity")
    return fields


def _content(content: Any, param: str) -> Any:
    """Message content: a string, or parts (`input_text`, `output_text`, `input_image`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid("Input should be a string or a list of content parts", param)
    parts: list[Body] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: Body = {"url": part["image_url"]}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise invalid(f"content parts of type {kind!r} cannot be sent to this model",
                          f"{param}[{index}].type")
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _output_text(output: Any, param: str) -> str:
    if isinstance(output, str):
        return output
    content = _content(output, param)
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def _messages(items: list[Body], param: str) -> list[Body]:
    messages: list[Body] = []
    for index, item in enumerate(items):
        where = f"{param}[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise invalid("role must be user, assistant, system or developer",
                              f"{where}.role")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"),
                                 "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # its calls join it
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": _output_text(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            continue  # a model's own reasoning, which a chat backend cannot take back
        else:
            raise invalid(f"items of type {kind!r} cannot be sent to this model",
                          f"{where}.type")
    return messages


def _tools(tools: Any) -> list[Body]:
    if not isinstance(tools, list):
        raise invalid("Input should be a list", "tools")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise invalid("a function tool needs a name", f"tools[{index}].name")
        function: Body = {"name": tool["name"],
                          "parameters": tool.get("parameters") or {"type": "object"}}
        for name in ("description", "strict"):
            if tool.get(name) is not None:
                function[name] = tool[name]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise invalid("only auto, none, required or a function can be chosen here", "tool_choice")


def _response_format(text: Any) -> Body | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid("Input should be an object", "text")
    spec = text.get("format")
    if spec is None or (isinstance(spec, dict) and spec.get("type") == "text"):
        return None
    if isinstance(spec, dict) and spec.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(spec, dict) and spec.get("type") == "json_schema":
        schema = {name: spec[name] for name in ("name", "schema", "strict", "description")
                  if spec.get(name) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise invalid("format must be text, json_object or json_schema", "text.format")


def chat_request(body: Body, history: list[Body]) -> Body:
    """A Responses API request (after `history`) → a chat-completions request."""
    messages: list[Body] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("Input should be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    messages.extend(_messages(history, "previous_response_id"))
    messages.extend(_messages(input_items(body), "input"))
    chat: Body = {"model": body.get("model"), "messages": messages}
    for name in _SAME:
        if body.get(name) is not None:
            chat[name] = body[name]
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise invalid("Input should be a positive integer", "max_output_tokens")
        chat["max_tokens"] = limit
    tools = body.get("tools")
    functions = [tool for tool in tools if isinstance(tool, dict)
                 and tool.get("type") == "function"] if isinstance(tools, list) else tools
    if functions:  # the others (built-in tools) only a native backend takes
        chat["tools"] = _tools(functions)
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # response.completed reports it
    return chat
