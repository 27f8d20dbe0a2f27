"""A real aiohttp server over the tiny model, with spans captured in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from local_backend.engine.loop import Engine
from local_backend.server.app import create_app
from tests.local_backend.conftest import EngineFactory


@dataclass
class Served:
    server: TestServer
    engine: Engine
    spans: InMemorySpanExporter

    @property
    def url(self) -> str:
        return str(self.server.make_url("/v1"))

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url, api_key="unused", max_retries=0)


ServeFactory = Callable[..., Any]


@pytest.fixture
async def serve(make_engine: EngineFactory, aiohttp_server: Any) -> AsyncIterator[ServeFactory]:
    async def factory(**engine_overrides: Any) -> Served:
        engine = make_engine(start=False, **engine_overrides)
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        app = create_app(engine, model_name="tiny", tracer=provider.get_tracer("test"))
        return Served(await aiohttp_server(app), engine, exporter)

    yield factory
