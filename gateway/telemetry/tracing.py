"""Tracer provider setup from the standard `OTEL_*` environment variables.

Only the entry point (`routegate serve`) calls this; library modules take a
provider (or the no-op one) and call `trace.get_tracer(...)` on it. Nothing is
set globally, so tests can build as many providers as they like side by side.

Recognised variables (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/):

- `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` → no tracing at all.
- `OTEL_TRACES_EXPORTER` = `otlp` | `console` (comma-separated list allowed).
- `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`
  (`http/protobuf`, the default, or `grpc`), `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`,
  `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` (ms).
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`.
- `OTEL_TRACES_SAMPLER` (+ `_ARG`); default `parentbased_always_on`.
- `OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION` (`gzip`, `deflate`, `none`),
  `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`, `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY`.
- `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`.

With OTLP over HTTP as the only exporter (the usual production setting) spans are
encoded and sent by a separate exporter process (`span_pipe.py`); the request path
only records them. `ROUTEGATE_TRACE_EXPORT=thread` keeps the SDK's batch thread in
the gateway process instead; gRPC, console and several exporters always use it.

When neither an exporter nor an OTLP endpoint is named, tracing stays off and the
gateway uses the API's no-op provider: spans cost a few attribute look-ups.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from gateway.telemetry.otlp_encode import OtlpEncoder
from gateway.telemetry.otlp_post import ExportConfig
from gateway.telemetry.span_pipe import SpanPipe

log = logging.getLogger("routegate.tracing")

DEFAULT_SERVICE_NAME = "routegate"
DEFAULT_EXPORT_TIMEOUT_S = 10.0
DEFAULT_EXPORT_BATCH_SPANS = 2048  # spans per export request (~1 MB of OTLP)
DEFAULT_QUEUE_SPANS = 8192  # spans waiting for export before new ones are dropped
_HTTP_DEFAULT = "http://localhost:4318"
_GRPC_DEFAULT = "http://localhost:4317"


class TracingConfigError(ValueError):
    """An `OTEL_*` variable holds a value we cannot use; raised at start-up, never later."""


def _get(env: Mapping[str, str], name: str) -> str | None:
    """The traces-specific variable wins over the generic OTLP one."""
    specific = env.get(name.replace("OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_"))
    value = specific if specific else env.get(name)
    return value.strip() if value and value.strip() else None


def _pairs(value: str | None) -> dict[str, str]:
    """`k1=v1,k2=v2` (values URL-encoded, as the spec says) → dict."""
    out: dict[str, str] = {}
    for item in (value or "").split(","):
        key, sep, val = item.partition("=")
        if sep and key.strip():
            out[key.strip()] = unquote(val.strip())
    return out


def sampler_from_env(env: Mapping[str, str]) -> Sampler:
    name = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    arg = env.get("OTEL_TRACES_SAMPLER_ARG")
    try:
        ratio = float(arg) if arg else 1.0
    except ValueError as exc:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a number") from exc
    samplers: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": ParentBased(TraceIdRatioBased(ratio)),
    }
    if name not in samplers:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER={name!r} is not one of {sorted(samplers)}")
    return samplers[name]


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    protocol = _get(env, "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    headers = _pairs(_get(env, "OTEL_EXPORTER_OTLP_HEADERS"))
    timeout_ms = _get(env, "OTEL_EXPORTER_OTLP_TIMEOUT")
    timeout_s = float(timeout_ms) / 1000.0 if timeout_ms else DEFAULT_EXPORT_TIMEOUT_S
    traces_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        endpoint = traces_endpoint or base_endpoint or _GRPC_DEFAULT
        return GrpcExporter(
            endpoint=endpoint,
            insecure=endpoint.startswith("http://"),
            headers=headers or None,
            timeout=timeout_s,
        )
    if protocol in ("http/protobuf", "http"):
        # The signal-specific endpoint is used as-is; the base one gets the signal path.
        endpoint = traces_endpoint or f"{(base_endpoint or _HTTP_DEFAULT).rstrip('/')}/v1/traces"
        return FastOtlpHttpExporter(endpoint=endpoint, headers=headers or None,
                                    timeout=timeout_s)
    raise TracingConfigError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use http/protobuf or grpc"
    )


class FastOtlpHttpExporter(HttpExporter):
    """The SDK's OTLP/HTTP exporter (endpoint, headers, compression, TLS, retries all its
    own) with the request bytes written by `OtlpEncoder`: ~10 instead of ~27 µs a span.
    An SDK without the HTTP client this relies on gets its own encoder back."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._encoder = OtlpEncoder()

    @property
    def takes_light_spans(self) -> bool:
        """`export` may be given finished `LightSpan`s (read by attribute, like a
        `ReadableSpan`): it encodes them itself whenever the SDK's client is there."""
        return getattr(self, "_client", None) is not None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        client = getattr(self, "_client", None)
        if client is None or getattr(self, "_shutdown", False):
            return super().export(spans)
        data = self._encoder.request(spans)
        if len(data) > getattr(self, "_max_request_size", len(data)):
            log.warning("dropping a span batch of %d bytes: over the exporter's limit", len(data))
            return SpanExportResult.FAILURE
        result = client.export(data)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = (env.get(name) or "").strip()
    try:
        return int(value) if value else default
    except ValueError as exc:
        raise TracingConfigError(f"{name}={value!r} is not a whole number") from exc


def export_process_config(env: Mapping[str, str]) -> ExportConfig | None:
    """Where the exporter process sends spans, when the environment asks for OTLP/HTTP
    and nothing else (and `ROUTEGATE_TRACE_EXPORT` is not `thread`); else None."""
    if (env.get("ROUTEGATE_TRACE_EXPORT") or "").strip().lower() == "thread":
        return None
    protocol = _get(env, "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if _exporter_names(env) != ["otlp"] or protocol not in ("http/protobuf", "http"):
        return None
    headers = _pairs(_get(env, "OTEL_EXPORTER_OTLP_HEADERS"))
    timeout_ms = _get(env, "OTEL_EXPORTER_OTLP_TIMEOUT")
    compression = (_get(env, "OTEL_EXPORTER_OTLP_COMPRESSION") or "none").lower()
    if compression not in ("none", "gzip", "deflate"):
        raise TracingConfigError(f"OTEL_EXPORTER_OTLP_COMPRESSION={compression!r}: "
                                 "use gzip, deflate or none")
    traces_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return ExportConfig(
        endpoint=traces_endpoint or f"{(base_endpoint or _HTTP_DEFAULT).rstrip('/')}/v1/traces",
        headers=headers,
        timeout_s=float(timeout_ms) / 1000.0 if timeout_ms else DEFAULT_EXPORT_TIMEOUT_S,
        compression=compression,
        certificate=_get(env, "OTEL_EXPORTER_OTLP_CERTIFICATE"),
        client_certificate=_get(env, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
        client_key=_get(env, "OTEL_EXPORTER_OTLP_CLIENT_KEY"),
    )


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    """`OTEL_TRACES_EXPORTER`'s names; empty when tracing is off."""
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in (env.get("OTEL_TRACES_EXPORTER") or "").split(",")]
    names = [n for n in names if n]
    if not names:
        # No exporter named: only an explicit OTLP endpoint turns tracing on.
        has_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        )
        names = ["otlp"] if has_endpoint else []
    return [] if "none" in names else names


def exporters_from_env(env: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters the environment asks for; empty when it asks for none."""
    exporters: list[SpanExporter] = []
    for name in _exporter_names(env):
        if name == "otlp":
            exporters.append(_otlp_exporter(env))
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            raise TracingConfigError(f"OTEL_TRACES_EXPORTER={name!r}: use otlp, console or none")
    return exporters


class _HashedResource(Resource):
    """A `Resource` that hashes once. The OTLP encoder groups every exported span by its
    resource, and `Resource.__hash__` serialises all the attributes to JSON each time
    (~4 µs a span, on the same core as the requests). Resources are immutable."""

    def __init__(self, attributes: dict[str, str], schema_url: str | None = None) -> None:
        super().__init__(attributes, schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)


def resource_from_env(env: Mapping[str, str], default_service: str) -> Resource:
    attributes: dict[str, str] = _pairs(env.get("OTEL_RESOURCE_ATTRIBUTES"))
    service = (env.get("OTEL_SERVICE_NAME") or "").strip()
    attributes["service.name"] = service or attributes.get("service.name") or default_service
    # Resource() rather than Resource.create(): create() reads os.environ itself.
    return _HashedResource(attributes)


def tracer_provider_from_env(
    env: Mapping[str, str],
    *,
    service_name: str = DEFAULT_SERVICE_NAME,
    exporters: list[SpanExporter] | None = None,
) -> TracerProvider | None:
    """A provider exporting in batches off the request path, or None when tracing is off.

    `exporters` replaces the ones the environment names (tests pass an in-memory one).
    The caller owns the provider and calls `shutdown()` to flush at exit.
    """
    chosen = exporters if exporters is not None else exporters_from_env(env)
    if not chosen:
        return None
    resource = resource_from_env(env, service_name)
    provider = TracerProvider(sampler=sampler_from_env(env), resource=resource)
    export = export_process_config(env) if exporters is None else None
    if export is not None:
        queue_spans, batch_spans, delay_ms = (
            _int(env, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE_SPANS),
            _int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_EXPORT_BATCH_SPANS),
            _int(env, "OTEL_BSP_SCHEDULE_DELAY", 5000))
        provider.add_span_processor(SpanPipe(
            export, resource=dict(resource.attributes), schema_url=resource.schema_url,
            max_queue_spans=queue_spans, max_batch_spans=min(batch_spans, queue_spans),
            schedule_delay_s=delay_ms / 1000.0))
        return provider
    # Larger batches than the SDK's 512 unless `OTEL_BSP_*` say otherwise: each export
    # costs a fixed share of CPU however few spans it carries (HTTP request, connection, netrc
    # lookup), on the core that serves requests. A busy gateway fills a batch in well
    # under the schedule delay, so this changes how often it exports, not how late.
    batch = None if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in env else DEFAULT_EXPORT_BATCH_SPANS
    queue = None if "OTEL_BSP_MAX_QUEUE_SIZE" in env else DEFAULT_QUEUE_SPANS
    for exporter in chosen:
        provider.add_span_processor(BatchSpanProcessor(
            exporter, max_queue_size=queue, max_export_batch_size=batch))
    return provider
