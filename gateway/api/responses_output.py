"""Chat completions as OpenAI Responses API objects and events. Pure.

    Shell(body, response_id, created_at)  the `response` object's request-side fields
    response_of(shell, completion)        chat.completion → a `response` object
    EventEncoder(shell).feed(SSE bytes)   chat.completion.chunk SSE → the Responses event
                                          stream: response.created, response.in_progress,
                                          output items (message text, function calls) as
                                          added / delta / done, then response.completed

The events carry the fields and identities the official SDKs check (an item keeps its
id from `added` to `done`, `response.completed` lists every item, `sequence_number`
counts from 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from random import getrandbits
from typing import Any

import orjson

from gateway.api.chunk_reader import ChunkReader

Body = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{getrandbits(96):024x}"


@dataclass(slots=True)
class Shell:
    """What a `response` object repeats of its request."""

    body: Body
    response_id: str
    created_at: int

    def response(self, *, status: str, model: str, output: list[Body],
                 usage: Body | None = None, incomplete: str | None = None,
                 error: Body | None = None) -> Body:
        body = self.body
        text = body.get("text")
        text = text if isinstance(text, dict) else {}
        return {
            "id": self.response_id, "object": "response", "created_at": self.created_at,
            "status": status, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": model,
            "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "store": body.get("store", True), "temperature": body.get("temperature"),
            "text": {"format": {"type": "text"}, **text},
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "top_p": body.get("top_p"), "truncation": body.get("truncation", "disabled"),
            "usage": usage, "user": body.get("user"), "metadata": body.get("metadata") or {},
        }


def usage_of(usage: Any) -> Body | None:
    """Chat usage → Responses usage."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": usage.get("total_tokens") or prompt + completion}


def _incomplete(finish_reason: Any) -> str | None:
    return {"length": "max_output_tokens", "content_filter": "content_filter"}.get(
        finish_reason) if isinstance(finish_reason, str) else None


def message_item(item_id: str, text: str, status: str = "completed") -> Body:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": content if status == "completed" else []}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> Body:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def response_of(shell: Shell, completion: Body) -> Body:
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[Body] = []
    text = message.get("content") or message.get("refusal")
    if text:
        output.append(message_item(new_id("msg"), text))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        output.append(call_item(new_id("fc"), call.get("id") or new_id("call"),
                                function.get("name", ""), function.get("arguments") or ""))
    incomplete = _incomplete(choice.get("finish_reason"))
    return shell.response(status="incomplete" if incomplete else "completed",
                          model=completion.get("model", ""), output=output,
                          usage=usage_of(completion.get("usage")), incomplete=incomplete)


@dataclass(slots=True)
class _Open:
    """An output item being streamed."""

    index: int
    item_id: str
    kind: str  # "message" or "function_call"
    text: str = ""  # the message's text, or the call's arguments
    call_id: str = ""
    name: str = ""


@dataclass
class EventEncoder(ChunkReader):
    """`chat.completion.chunk` SSE → Responses events, one write at a time. `final` is
    the finished `response` object once `response.completed` has been written."""

    shell: Shell
    final: Body | None = None
    _sequence: int = 0
    _model: str = ""
    _started: bool = False
    _output: list[Body] = field(default_factory=list)
    _message: _Open | None = None
    _calls: dict[int, _Open] = field(default_factory=dict)  # chat tool_calls index → item
    _usage: Body | None = None
    _incomplete: str | None = None

    def _emit(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    def _chunk(self, chunk: Body) -> bytes:
        out = [] if self._started else [self._start(chunk)]
        if isinstance(chunk.get("error"), dict):
            out.append(self._failed(chunk["error"]))
            return b"".join(out)
        if isinstance(chunk.get("usage"), dict):
            self._usage = usage_of(chunk["usage"])
        for choice in (chunk.get("choices") or [])[:1]:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(self._text(delta["content"]))
            for call in delta.get("tool_calls") or ():
                out.append(self._call(call))
            if choice.get("finish_reason"):
                self._incomplete = _incomplete(choice["finish_reason"])
                out.append(self._close_all())
        return b"".join(out)

    def _start(self, chunk: Body) -> bytes:
        self._started = True
        self._model = chunk.get("model", "")
        response = self.shell.response(status="in_progress", model=self._model, output=[])
        return (self._emit("response.created", response=response)
                + self._emit("response.in_progress", response=response))

    def _add(self, item: Body) -> tuple[int, bytes]:
        index = len(self._output)
        self._output.append(item)
        return index, self._emit("response.output_item.added", output_index=index, item=item)

    def _text(self, text: str) -> bytes:
        out = b""
        if self._message is None:
            item_id = new_id("msg")
            index, out = self._add(message_item(item_id, "", status="in_progress"))
            self._message = _Open(index, item_id, "message")
            out += self._emit("response.content_part.added", item_id=item_id,
                              output_index=index, content_index=0,
                              part={"type": "output_text", "text": "", "annotations": [],
                                    "logprobs": []})
        self._message.text += text
        return out + self._emit("response.output_text.delta", item_id=self._message.item_id,
                                output_index=self._message.index, content_index=0,
                                delta=text, logprobs=[])

    def _call(self, call: Body) -> bytes:
        position = call.get("index", 0)
        function = call.get("function") or {}
        out = b""
        opened = self._calls.get(position)
        if opened is None:
            out = self._close_message()
            item_id = new_id("fc")
            call_id, name = call.get("id") or new_id("call"), function.get("name") or ""
            index, added = self._add(call_item(item_id, call_id, name, "",
                                               status="in_progress"))
            opened = self._calls[position] = _Open(index, item_id, "function_call",
                                                   call_id=call_id, name=name)
            out += added
        arguments = function.get("arguments")
        if arguments:
            opened.text += arguments
            out += self._emit("response.function_call_arguments.delta",
                              item_id=opened.item_id, output_index=opened.index,
                              delta=arguments)
        return out

    def _close_message(self) -> bytes:
        opened, self._message = self._message, None
        if opened is None:
            return b""
        part = {"type": "output_text", "text": opened.text, "annotations": [], "logprobs": []}
        item = self._output[opened.index] = message_item(opened.item_id, opened.text)
        where = {"item_id": opened.item_id, "output_index": opened.index, "content_index": 0}
        return (self._emit("response.output_text.done", **where, text=opened.text,
                           logprobs=[])
                + self._emit("response.content_part.done", **where, part=part)
                + self._emit("response.output_item.done", output_index=opened.index,
                             item=item))

    def _close_all(self) -> bytes:
        out = [self._close_message()]
        for opened in self._calls.values():
            item = self._output[opened.index] = call_item(
                opened.item_id, opened.call_id, opened.name, opened.text)
            out.append(self._emit("response.function_call_arguments.done",
                                  item_id=opened.item_id, output_index=opened.index,
                                  name=opened.name, arguments=opened.text))
            out.append(self._emit("response.output_item.done", output_index=opened.index,
                                  item=item))
        self._calls.clear()
        return b"".join(out)

    def _finish(self) -> bytes:
        out = (b"" if self._started else self._start({})) + self._close_all()
        status = "incomplete" if self._incomplete else "completed"
        self.final = self.shell.response(status=status, model=self._model,
                                         output=self._output, usage=self._usage,
                                         incomplete=self._incomplete)
        kind = "response.incomplete" if self._incomplete else "response.completed"
        return out + self._emit(kind, response=self.final)

    def _failed(self, error: Body) -> bytes:
        response = self.shell.response(
            status="failed", model=self._model, output=self._output, usage=self._usage,
            error={"code": str(error.get("code") or "server_error"),
                   "message": str(error.get("message", ""))})
        return self._emit("response.failed", response=response)
