"""A PyTorch inference engine with an OpenAI-compatible server; independent of the gateway."""

from local_backend.engine.loop import (
    Engine,
    EngineConfig,
    QueueFull,
    RequestOutput,
    RequestRejected,
)
from local_backend.engine.params import SamplingParams

__all__ = [
    "Engine",
    "EngineConfig",
    "QueueFull",
    "RequestOutput",
    "RequestRejected",
    "SamplingParams",
]
