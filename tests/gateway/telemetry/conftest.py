from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.gateway.telemetry.otlp_receiver import OtlpReceiver, start_http


@pytest.fixture
async def otlp_receiver() -> AsyncIterator[tuple[OtlpReceiver, str]]:
    """A real OTLP/HTTP receiver on loopback: (receiver, its base URL)."""
    receiver = OtlpReceiver()
    runner, url = await start_http(receiver)
    yield receiver, url
    await runner.cleanup()
