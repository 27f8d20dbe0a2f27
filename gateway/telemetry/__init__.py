"""Traces, metrics, the Server-Timing split, access logs and the live dashboard's data."""

from gateway.telemetry.access_log import AccessLog, AccessRecord
from gateway.telemetry.attempt import UpstreamAttempt
from gateway.telemetry.inference_time import InferenceReport, from_body, from_headers
from gateway.telemetry.live import LiveStats
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.request import RequestTelemetry
from gateway.telemetry.service import Telemetry
from gateway.telemetry.timing import RequestTimings, TimingSplit
from gateway.telemetry.tracing import tracer_provider_from_env

__all__ = [
    "AccessLog",
    "AccessRecord",
    "GatewayMetrics",
    "InferenceReport",
    "LiveStats",
    "RequestTelemetry",
    "RequestTimings",
    "Telemetry",
    "TimingSplit",
    "UpstreamAttempt",
    "from_body",
    "from_headers",
    "tracer_provider_from_env",
]
