"""Reports on finished requests: metrics, the access log, the live dashboard's data and
traces (`tracing/`), all read from the request record."""

from gateway.telemetry.access_log import AccessLog, AccessRecord
from gateway.telemetry.live import LiveWindow
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing, tracing_from_env

__all__ = [
    "AccessLog",
    "AccessRecord",
    "GatewayMetrics",
    "LiveWindow",
    "Telemetry",
    "Tracing",
    "tracing_from_env",
]
