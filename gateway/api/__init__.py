"""The HTTP API surface: OpenAI-compatible handlers (`gateway.api.openai`) and request
validation and rewriting (`validate`, `rewrite`). Nothing is re-exported here, so the
pipeline can use `rewrite` without importing the handlers that import the pipeline."""

__all__: list[str] = []
