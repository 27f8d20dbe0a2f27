"""`python -m local_backend --model demo` comes up healthy in seconds, serves, and exports spans."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from local_backend.__main__ import main, parse_args
from local_backend.telemetry import tracer_provider_from_env
from policies.bands import PRIORITY_BANDS
from tests.ports import free_port

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


async def otlp_receiver(aiohttp_server: Any) -> tuple[str, list[Any]]:
    """A real OTLP/HTTP endpoint: decodes each protobuf export and keeps its spans."""
    spans: list[Any] = []

    async def traces(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), spans


async def wait_healthy(base: str, proc: asyncio.subprocess.Process) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            assert proc.returncode is None, "local_backend exited"
            try:
                async with http.get(base + "/health") as resp:
                    health = await resp.json()  # only once warmed up, with its rates
                    assert health["status"] == "ok" and health["decode_tokens_per_s"] > 0
                    return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    raise AssertionError("no /health within 60 s")


@pytest.mark.slow
async def test_demo_model_serves_and_exports_engine_spans(
    tmp_path: Path, aiohttp_server: Any
) -> None:
    endpoint, spans = await otlp_receiver(aiohttp_server)
    port = free_port()
    env = {**os.environ, "ROUTEGATE_CACHE_DIR": str(tmp_path),
           "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "local_backend", "--model", "demo", "--port", str(port),
        "--threads", "1", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(base, proc)
        async with aiohttp.ClientSession() as http, http.post(
            base + "/v1/chat/completions",
            json={"model": "demo", "max_tokens": 4,
                  "messages": [{"role": "user", "content": "hi"}]},
            headers={"traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01"},
        ) as resp:
            body = await resp.json()
            assert "inference;dur=" in resp.headers["Server-Timing"]
        assert body["model"] == "demo" and body["usage"]["completion_tokens"] >= 1
        assert (tmp_path / "demo-model-v2" / "config.json").is_file()
        for _ in range(100):
            if {s.name for s in spans} >= {"engine.queue", "engine.prefill", "engine.decode"}:
                break
            await asyncio.sleep(0.05)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
    engine_spans = [s for s in spans if s.name.startswith("engine.")]
    assert {s.name for s in engine_spans} == {"engine.queue", "engine.prefill", "engine.decode"}
    assert all(s.trace_id.hex() == TRACE_ID for s in engine_spans)


def test_missing_model_directory_exits_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--model", str(tmp_path / "nowhere"), "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_no_exporter_unless_otel_variables_ask_for_one() -> None:
    assert tracer_provider_from_env({}) is None
    assert tracer_provider_from_env({"OTEL_TRACES_EXPORTER": "none",
                                     "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) is None
    provider = tracer_provider_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert provider is not None
    provider.shutdown()


@pytest.mark.parametrize("aging", ["0", "-1", "nan"])
def test_a_priority_aging_bound_must_be_positive(
        aging: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--model", "demo", "--priority-aging-s", aging])
    assert exited.value.code == 2
    assert "--priority-aging-s must be a positive number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--background-band", "-1"], "a band is 0 or more, not -1"),
    (["--background-band", "batch"], "not a band number or 'none': 'batch'"),
    (["--background-step-tokens", "0"], "--background-step-tokens must be at least 1"),
])
def test_a_bad_background_setting_is_refused_naming_it(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--model", "demo", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_background_band_is_the_gateways_batch_band_unless_named() -> None:
    assert parse_args(["--model", "demo"]).background_band == PRIORITY_BANDS["batch"]
    assert parse_args(["--model", "demo", "--background-band", "none"]).background_band is None
    assert parse_args(["--model", "demo", "--background-band", "2"]).background_band == 2
