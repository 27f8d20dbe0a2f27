"""What the server's handlers share: the engine and what serves it, per app."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from local_backend.chat_template import ChatTemplate
from local_backend.engine.loop import Engine
from local_backend.generation_config import GenerationConfig
from local_backend.server.idempotency import KeptAnswers
from local_backend.server.metrics import BackendMetrics
from local_backend.server.timing import SpanRecorder
from local_backend.server.warmup import MeasuredRates

RETRY_AFTER_S = 1  # what a 429 or 503 asks the client to wait
# The time the caller still waits for the answer, in ms (a gateway sends it): past it the
# request is dropped if still queued (504) or stopped where it is.
DEADLINE_HEADER = "x-routegate-deadline-ms"


@dataclass
class Backend:
    engine: Engine
    model_name: str
    template: ChatTemplate
    metrics: BackendMetrics
    spans: SpanRecorder
    defaults: GenerationConfig
    answers: KeptAnswers  # by Idempotency-Key (idempotency.py)
    rates: MeasuredRates | None = None  # once warmed up


BACKEND = web.AppKey("backend", Backend)
