# the traced gateway and an OTLP receiver, for the cache's span attribute
from tests.gateway.telemetry.conftest import otlp_receiver, start_traced

__all__ = ["otlp_receiver", "start_traced"]
