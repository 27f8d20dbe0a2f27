"""What the server cannot do is refused by name, never ignored; /v1/models says what it can."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from local_backend.server.protocol import CAPABILITIES
from tests.local_backend.server.conftest import ServeFactory

CHAT = [{"role": "user", "content": "Say something."}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"tools": [TOOL]}, "tools", "unsupported_value"),
    ({"tool_choice": "auto"}, "tool_choice", "unsupported_value"),
    ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "unsupported_value"),
    ({"min_p": 0.1}, "min_p", "unsupported_parameter"),
    ({"repetition_penalty": 1.1}, "repetition_penalty", "unsupported_parameter"),
    ({"stop_token_ids": [2]}, "stop_token_ids", "unsupported_parameter"),
    ({"functions": [TOOL["function"]]}, "functions", "unsupported_parameter"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "unsupported_parameter"),
    ({"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
     "messages[0].content[1]", "unsupported_value"),
])
async def test_an_unsupported_parameter_is_a_400_naming_it(
        serve: ServeFactory, extra: dict[str, Any], param: str, code: str) -> None:
    served = await serve()
    async with aiohttp.ClientSession() as http, http.post(
            served.url + "/chat/completions", json={"messages": CHAT, **extra}) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert (error["param"], error["code"], error["type"]) == \
        (param, code, "invalid_request_error")


async def test_the_values_that_ask_for_nothing_are_accepted(serve: ServeFactory) -> None:
    served = await serve()
    body = {"messages": CHAT, "max_tokens": 2, "tools": [], "tool_choice": "none",
            "response_format": {"type": "text"}, "modalities": ["text"],
            "parallel_tool_calls": False, "store": False, "metadata": {"app": "x"}}
    async with aiohttp.ClientSession() as http, http.post(
            served.url + "/chat/completions", json=body) as resp:
        assert resp.status == 200


async def test_a_completion_refuses_chat_only_fields(serve: ServeFactory) -> None:
    served = await serve()
    async with aiohttp.ClientSession() as http, http.post(
            served.url + "/completions", json={"prompt": "hi", "tools": [TOOL]}) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "tools"


async def test_models_reports_what_the_server_can_do(serve: ServeFactory) -> None:
    served = await serve()
    async with aiohttp.ClientSession() as http, http.get(served.url + "/models") as resp:
        card = (await resp.json())["data"][0]
    assert card["capabilities"] == CAPABILITIES
    assert card["capabilities"]["tools"] is False and card["capabilities"]["n"] == 16
    assert card["max_model_len"] == served.engine.max_model_len
