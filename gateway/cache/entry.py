"""A cached answer is one whole `chat.completion`. Pure.

    assembled(sse bytes, usage)    a streamed answer (its `chat.completion.chunk` events,
                                   as relayed) → the whole completion, or None when the
                                   stream did not end cleanly
    replayed(completion, usage?)   a whole completion → the chunk events a backend would
                                   have streamed: role, content, tool calls, finish, and
                                   the usage-only chunk when the client asked for it
    encode / decode                the stored bytes: the saved cost (µUSD) on a first
                                   line, then the completion's JSON as it was answered
"""

from __future__ import annotations

from typing import Any

import orjson

Body = dict[str, Any]


def encode(completion: bytes, cost_micros: int) -> bytes:
    return b"%d\n" % cost_micros + completion


def decode(stored: bytes) -> tuple[bytes, int]:
    cost, _, completion = stored.partition(b"\n")
    return completion, int(cost)


def assembled(stream: bytes, usage: Body | None) -> Body | None:
    head: Body = {}
    choices: dict[int, Body] = {}
    for event in stream.split(b"\n\n"):
        if not event.startswith(b"data:"):
            continue  # comments, blank tail
        payload = event[5:].strip()
        if payload == b"[DONE]":
            continue
        chunk = orjson.loads(payload)
        if not isinstance(chunk, dict) or "error" in chunk:
            return None  # a stream that ended in an error is not an answer to keep
        if not head:
            head = {name: chunk.get(name) for name in ("id", "created", "model",
                                                       "system_fingerprint")}
        for choice in chunk.get("choices") or ():
            whole = choices.setdefault(choice.get("index", 0), {
                "content": [], "calls": {}, "finish_reason": None})
            delta = choice.get("delta") or {}
            if delta.get("content"):
                whole["content"].append(delta["content"])
            for call in delta.get("tool_calls") or ():
                kept = whole["calls"].setdefault(call.get("index", 0), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                function = call.get("function") or {}
                kept["id"] = call.get("id") or kept["id"]
                kept["function"]["name"] += function.get("name") or ""
                kept["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                whole["finish_reason"] = choice["finish_reason"]
    if not choices or any(whole["finish_reason"] is None for whole in choices.values()):
        return None  # cut short: no finish reason
    out = []
    for index in sorted(choices):
        whole = choices[index]
        message: Body = {"role": "assistant",
                         "content": "".join(whole["content"]) if whole["content"] else None}
        if whole["calls"]:
            message["tool_calls"] = [whole["calls"][key] for key in sorted(whole["calls"])]
        out.append({"index": index, "message": message, "logprobs": None,
                    "finish_reason": whole["finish_reason"]})
    return {**head, "object": "chat.completion", "choices": out, "usage": usage}


def replayed(completion: Body, *, with_usage: bool) -> bytes:
    base = {name: completion.get(name) for name in ("id", "created", "model",
                                                    "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    if with_usage:
        base["usage"] = None

    def event(choices: list[Body], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**base, "choices": choices, **extra}) + b"\n\n"

    out: list[bytes] = []
    for choice in completion.get("choices") or ():
        index, message = choice.get("index", 0), choice.get("message") or {}

        def delta(fields: Body, finish: str | None = None, at: int = index) -> bytes:
            return event([{"index": at, "delta": fields, "logprobs": None,
                           "finish_reason": finish}])

        out.append(delta({"role": "assistant", "content": ""}))
        if message.get("content"):
            out.append(delta({"content": message["content"]}))
        for position, call in enumerate(message.get("tool_calls") or ()):
            out.append(delta({"tool_calls": [{"index": position, **call}]}))
        out.append(delta({}, choice.get("finish_reason") or "stop"))
    if with_usage:
        out.append(event([], usage=completion.get("usage")))
    return b"".join(out)
