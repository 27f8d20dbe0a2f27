"""The README's Python tour, run as written against the gateway: it prints the answer
and the usage, and nothing a reader would take for a fault (`None`, stray blank lines)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from pathlib import Path

from tests.conftest import StartGateway, StartUpstream, single_backend_policy

README = Path(__file__).parents[2] / "README.md"
TOUR_URL = "http://127.0.0.1:8080/v1"


def tour_snippet() -> str:
    [first] = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[:1]
    assert TOUR_URL in first
    return first


async def test_the_readme_python_tour_prints_answers_and_usage_only(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(single_backend_policy(upstream.url))
    code = tour_snippet().replace(TOUR_URL, gateway.base_url)

    def run() -> str:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "README.md", "exec"), {})
        return printed.getvalue()

    lines = (await asyncio.to_thread(run)).splitlines()
    reply = upstream.behaviour.reply
    assert lines[0] == reply  # the whole answer
    assert lines[1] == reply  # the stream, token by token on one line
    assert "completion_tokens" in lines[2]  # then its usage
    assert len(lines) == 3 and "None" not in lines
