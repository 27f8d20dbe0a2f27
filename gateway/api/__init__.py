"""The HTTP API surface: OpenAI-compatible handlers and request validation."""

from gateway.api.openai import PIPELINE, add_routes

__all__ = ["PIPELINE", "add_routes"]
