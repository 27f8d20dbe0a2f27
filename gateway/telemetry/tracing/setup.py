"""The gateway's traces from the standard `OTEL_*` environment variables.

Only the entry point (`routegate serve`) calls this. Nothing is set globally, so
tests can build as many `Tracing`s as they like side by side.

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

And one of ours, set by the supervisor of `serve --workers N` for its workers, never by
hand: `ROUTEGATE_TRACE_EXPORTER=unix:PATH`, the exporter process they all send to.

Either way a request's spans are built from its finished record
(`span_build.py`). With OTLP over HTTP as the only exporter (the usual production
setting) the records go to a separate exporter process (`pipe.py`), which builds,
encodes and sends the spans; gRPC, console and several exporters get them through
one adapter into the SDK's stock `BatchSpanProcessor` (`sdk_sink.py`). Under
`serve --workers N` that process is one for all workers, run by their supervisor
(`export_process_settings` is what it starts it with).

When neither an exporter nor an OTLP endpoint is named, tracing stays off.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from gateway.core.record import RequestRecord
from gateway.telemetry.tracing.export_process import exporter_config
from gateway.telemetry.tracing.otlp_post import ExportConfig
from gateway.telemetry.tracing.pipe import SpanPipe
from gateway.telemetry.tracing.sdk_sink import ProcessorSink
from gateway.telemetry.tracing.trace_context import Sampling

log = logging.getLogger("routegate.tracing")

DEFAULT_SERVICE_NAME = "routegate"
DEFAULT_EXPORT_TIMEOUT_S = 10.0
DEFAULT_EXPORT_BATCH_SPANS = 2048  # spans per export request (~1 MB of OTLP)
DEFAULT_QUEUE_SPANS = 8192  # spans waiting for export before new ones are dropped
TRACE_EXPORTER_ENV = "ROUTEGATE_TRACE_EXPORTER"
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
        return HttpExporter(endpoint=endpoint, headers=headers or None, timeout=timeout_s)
    raise TracingConfigError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use http/protobuf or grpc"
    )


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = (env.get(name) or "").strip()
    try:
        return int(value) if value else default
    except ValueError as exc:
        raise TracingConfigError(f"{name}={value!r} is not a whole number") from exc


def export_process_config(env: Mapping[str, str]) -> ExportConfig | None:
    """Where the exporter process sends spans, when the environment asks for OTLP/HTTP
    and nothing else; else None."""
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


@dataclass(frozen=True, slots=True)
class ExportProcessSettings:
    """What an exporter process is started with, and a `SpanPipe` bounded by."""

    export: ExportConfig
    resource: dict[str, Any]
    schema_url: str
    max_queue_spans: int
    max_batch_spans: int
    schedule_delay_s: float

    def config(self) -> dict[str, Any]:
        """The exporter process's config frame."""
        return exporter_config(self.export, resource=self.resource,
                               schema_url=self.schema_url,
                               max_batch_spans=self.max_batch_spans,
                               schedule_delay_s=self.schedule_delay_s)


def export_process_settings(env: Mapping[str, str], service_name: str = DEFAULT_SERVICE_NAME,
                            ) -> ExportProcessSettings | None:
    """The exporter process the environment asks for (OTLP/HTTP and nothing else);
    else None."""
    export = export_process_config(env)
    if export is None:
        return None
    resource = resource_from_env(env, service_name)
    queue_spans, batch_spans, delay_ms = (
        _int(env, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE_SPANS),
        _int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_EXPORT_BATCH_SPANS),
        _int(env, "OTEL_BSP_SCHEDULE_DELAY", 5000))
    return ExportProcessSettings(export, dict(resource.attributes), resource.schema_url or "",
                                 queue_spans, min(batch_spans, queue_spans), delay_ms / 1000.0)


def shared_exporter_env(path: Path) -> dict[str, str]:
    """What tells a worker's `tracing_from_env` to send to the exporter at `path`."""
    return {TRACE_EXPORTER_ENV: f"unix:{path}"}


def _shared_exporter_path(env: Mapping[str, str]) -> str | None:
    value = (env.get(TRACE_EXPORTER_ENV) or "").strip()
    if not value:
        return None
    scheme, _, path = value.partition(":")
    if scheme != "unix" or not path:
        raise TracingConfigError(f"{TRACE_EXPORTER_ENV}={value!r}: use unix:PATH")
    return path


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


def resource_from_env(env: Mapping[str, str], default_service: str) -> Resource:
    attributes: dict[str, str] = _pairs(env.get("OTEL_RESOURCE_ATTRIBUTES"))
    service = (env.get("OTEL_SERVICE_NAME") or "").strip()
    attributes["service.name"] = service or attributes.get("service.name") or default_service
    # Resource() rather than Resource.create(): create() reads os.environ itself.
    return Resource(attributes)


class SpanSink(Protocol):
    """Where sampled, finished request records go to become exported spans."""

    def export(self, record: RequestRecord) -> None:
        """Never waits: a sink that cannot keep up drops, and counts what it dropped."""
        ...

    @property
    def dropped_spans(self) -> int: ...

    def force_flush(self, timeout_millis: int = 30000) -> bool: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Tracing:
    """How requests are sampled, and where their records go."""

    sampling: Sampling
    sink: SpanSink

    @classmethod
    def to_processors(cls, processors: Sequence[SpanProcessor], *,
                      sampler: Sampler | None = None, resource: Resource | None = None,
                      ) -> Tracing:
        """Spans into the SDK's own processors (tests: an in-memory exporter's)."""
        return cls(Sampling(sampler or ParentBased(ALWAYS_ON)),
                   ProcessorSink(processors, resource or Resource({
                       "service.name": DEFAULT_SERVICE_NAME})))


def tracing_from_env(
    env: Mapping[str, str],
    *,
    service_name: str = DEFAULT_SERVICE_NAME,
    exporters: list[SpanExporter] | None = None,
) -> Tracing | None:
    """The traces the environment asks for, exported in batches off the request path;
    None when tracing is off. `exporters` replaces the ones the environment names
    (tests pass an in-memory one). The caller calls `sink.shutdown()` to flush at exit.
    """
    if exporters is None and not _exporter_names(env):
        return None
    if exporters is not None and not exporters:
        return None
    resource = resource_from_env(env, service_name)
    sampling = Sampling(sampler_from_env(env))
    piped = export_process_settings(env, service_name) if exporters is None else None
    if piped is not None:
        return Tracing(sampling, SpanPipe(
            piped.export, resource=piped.resource, schema_url=piped.schema_url,
            max_queue_spans=piped.max_queue_spans, max_batch_spans=piped.max_batch_spans,
            schedule_delay_s=piped.schedule_delay_s,
            connect_to=_shared_exporter_path(env)))
    chosen = exporters if exporters is not None else exporters_from_env(env)
    # Larger batches than the SDK's 512 unless `OTEL_BSP_*` say otherwise: each export
    # costs a fixed share of CPU however few spans it carries (HTTP request, connection),
    # on the core that serves requests. A busy gateway fills a batch in well under the
    # schedule delay, so this changes how often it exports, not how late.
    batch = None if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in env else DEFAULT_EXPORT_BATCH_SPANS
    queue = None if "OTEL_BSP_MAX_QUEUE_SIZE" in env else DEFAULT_QUEUE_SPANS
    return Tracing(sampling, ProcessorSink(
        [BatchSpanProcessor(exporter, max_queue_size=queue, max_export_batch_size=batch)
         for exporter in chosen], resource))
