"""A Responses request to a backend that speaks the Responses API (`responses: native`)
goes as the client wrote it, only `model` changed, and its usage is what the ledger
charges, streamed or not."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.conftest import RunningGateway, StartGateway
from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.limits.test_gateway_limits import ADMIN_HASH, usage
from tests.gateway.responses.conftest import responses_policy

# as a client would write it: its own spacing and field order, fields only the
# Responses API has
REQUEST = (b'{"model": "chat", "input": "Search the web.",  "reasoning": {"effort": "low"},'
           b' "include": ["web_search_call.action.sources"], "tools": [{"type": "web_search"}],'
           b' "metadata": {"ticket": "T-1"}, "truncation": "auto"}')


def priced(url: str) -> dict[str, object]:
    policy = responses_policy(native_url=url)
    policy["backends"]["native"]["models"]["gpt-5"] = {
        "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
    policy["auth"] = {"anonymous": {"enabled": True, "loopback_only": True},
                      "admin_keys": [ADMIN_HASH]}
    return policy


async def post(gateway: RunningGateway, body: bytes) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/responses", data=body,
            headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.read()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_request_reaches_the_native_backend_as_written(
        native_upstream: FakeResponses, start_gateway: StartGateway, stream: bool) -> None:
    gateway = await start_gateway(responses_policy(native_url=native_upstream.url))
    body = REQUEST if not stream else REQUEST[:-1] + b', "stream": true}'

    status, _ = await post(gateway, body)

    assert status == 200
    assert native_upstream.received_raw[-1] == body.replace(b'"model": "chat"',
                                                            b'"model": "gpt-5"')


@pytest.mark.parametrize("stream", [False, True])
async def test_the_ledger_charges_the_usage_the_native_backend_reported(
        native_upstream: FakeResponses, start_gateway: StartGateway, stream: bool) -> None:
    gateway = await start_gateway(priced(native_upstream.url))
    body = orjson.dumps({"model": "chat", "input": "one two three", "stream": stream})

    status, _ = await post(gateway, body)

    assert status == 200
    day = (await usage(gateway.url))["day"]
    # the fake counts the words of the input's JSON (3) and answers 5 tokens
    assert (day["input_tokens"], day["output_tokens"]) == (3, 5)
    assert day["spend_micros"] == 3 * 1 + 5 * 2
