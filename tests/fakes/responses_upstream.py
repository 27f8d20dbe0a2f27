"""A small server speaking OpenAI's Responses API (`POST /v1/responses`), JSON and SSE.

    fake = FakeResponses()
    base_url = await fake.start()       # "http://127.0.0.1:<port>/v1"
    fake.received[-1]                   # the JSON bodies the gateway sent
    fake.received_raw[-1]               # ... byte for byte
    await fake.stop()

It answers with `reply` as one message, or, when the request offers function tools and
its last input item is not a `function_call_output`, with a call of `tool_call`. It has
no `/chat/completions`: a gateway that does not send the request natively gets a 404.
Streams follow OpenAI's event order with `event:` lines and `sequence_number`s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Body = dict[str, Any]


@dataclass
class FakeResponses:
    reply: str = "Hello from the native Responses backend."
    tool_call: tuple[str, str] = ("get_weather", '{"city": "Paris"}')
    received: list[Body] = field(default_factory=list)
    received_raw: list[bytes] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._count = 0
        self.app = web.Application()
        self.app.router.add_post("/v1/responses", self._create)

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _output(self, body: Body) -> list[Body]:
        items = body["input"] if isinstance(body["input"], list) else []
        tools = [tool for tool in body.get("tools") or () if tool.get("type") == "function"]
        if tools and not (items and items[-1].get("type") == "function_call_output"):
            name, arguments = self.tool_call
            return [{"id": f"fc_native{self._count}", "type": "function_call",
                     "call_id": f"call_native{self._count}", "name": name,
                     "arguments": arguments, "status": "completed"}]
        return [{"id": f"msg_native{self._count}", "type": "message", "role": "assistant",
                 "status": "completed", "content": [
                     {"type": "output_text", "text": self.reply, "annotations": []}]}]

    def _response(self, body: Body, status: str, output: list[Body]) -> Body:
        words = len(orjson.dumps(body["input"]).split())
        return {"id": f"resp_native{self._count}", "object": "response",
                "created_at": int(time.time()), "status": status, "error": None,
                "incomplete_details": None, "instructions": body.get("instructions"),
                "model": body["model"], "output": output, "parallel_tool_calls": True,
                "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
                "temperature": body.get("temperature"), "top_p": body.get("top_p"),
                "previous_response_id": None, "store": body.get("store", True),
                "text": {"format": {"type": "text"}}, "truncation": "disabled",
                "metadata": {}, "usage": None if status != "completed" else {
                    "input_tokens": words, "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": words + 5}}

    async def _create(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        self.received.append(body)
        self.received_raw.append(raw)
        self._count += 1
        output = self._output(body)
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(self._response(body, "completed", output)),
                                content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        sequence = 0

        async def send(kind: str, **fields: Any) -> None:
            nonlocal sequence
            event = {"type": kind, "sequence_number": sequence, **fields}
            sequence += 1
            await response.write(f"event: {kind}\ndata: ".encode() + orjson.dumps(event)
                                 + b"\n\n")

        await send("response.created", response=self._response(body, "in_progress", []))
        item = output[0]
        if item["type"] == "message":
            text = item["content"][0]["text"]
            where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
            await send("response.output_item.added", output_index=0,
                       item={**item, "status": "in_progress", "content": []})
            await send("response.content_part.added", **where,
                       part={"type": "output_text", "text": "", "annotations": []})
            for index, word in enumerate(text.split(" ")):
                await send("response.output_text.delta", **where,
                           delta=word if index == 0 else " " + word, logprobs=[])
            await send("response.output_text.done", **where, text=text, logprobs=[])
            await send("response.content_part.done", **where, part=item["content"][0])
        else:
            await send("response.output_item.added", output_index=0,
                       item={**item, "status": "in_progress", "arguments": ""})
            await send("response.function_call_arguments.delta", item_id=item["id"],
                       output_index=0, delta=item["arguments"])
            await send("response.function_call_arguments.done", item_id=item["id"],
                       output_index=0, arguments=item["arguments"])
        await send("response.output_item.done", output_index=0, item=item)
        await send("response.completed", response=self._response(body, "completed", output))
        await response.write_eof()
        return response
