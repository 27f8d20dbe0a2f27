"""The OpenAI-compatible HTTP face of the engine (aiohttp)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson
from aiohttp import web
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from local_backend.chat_template import ChatTemplate, ChatTemplateError
from local_backend.engine.loop import Engine, QueueFull, RequestOutput, RequestRejected
from local_backend.generation_config import GenerationConfig
from local_backend.server.answers import complete, stream
from local_backend.server.backend import BACKEND, DEADLINE_HEADER, RETRY_AFTER_S, Backend
from local_backend.server.errors import ApiError, bad_request, error_middleware
from local_backend.server.idempotency import IdempotencyLimits, KeptAnswers, key_of
from local_backend.server.metrics import BackendMetrics
from local_backend.server.prefix_tags import (
    block_chars_asked,
    events_handler,
    prefix_tags,
    prompt_text,
)
from local_backend.server.protocol import (
    CAPABILITIES,
    ParsedRequest,
    ResponseBuilder,
    choice_params,
    parse,
)
from local_backend.server.request_priority import priority_of
from local_backend.server.timing import (
    SpanRecorder,
    inbound_context,
)
from local_backend.server.warmup import warm_up

# Prompts longer than this are tokenised off the event loop.
INLINE_TOKENIZE_CHARS = 4096


def deadline_of(request: web.Request, arrival: float) -> float | None:
    """`arrival` + the header's milliseconds, on the engine clock; None without it."""
    value = request.headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    try:
        left_ms = float(value)
    except ValueError:
        left_ms = -1.0
    if not 0 <= left_ms < float("inf"):
        raise bad_request(f"{DEADLINE_HEADER} must be a non-negative number of milliseconds",
                          DEADLINE_HEADER)
    return arrival + left_ms / 1000.0


def create_app(
    engine: Engine,
    *,
    model_name: str,
    tracer: trace.Tracer | None = None,
    defaults: GenerationConfig | None = None,
    warm: bool = False,
    idempotency: IdempotencyLimits | None = None,
) -> web.Application:
    """`warm`: warm the engine up (`warmup`) before the server listens, so that `/health`
    answers only once requests run at full speed, and report its measured rates."""
    tok = engine.tokenizer
    backend_metrics = BackendMetrics(engine.stats, model_name)
    backend = Backend(
        engine=engine,
        model_name=model_name,
        template=ChatTemplate(tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token),
        metrics=backend_metrics,
        spans=SpanRecorder(tracer or trace.get_tracer("local_backend")),
        defaults=defaults or GenerationConfig(eos_token_ids=engine.eos_token_ids),
        answers=KeptAnswers(idempotency or IdempotencyLimits(),
                            backend_metrics.registry),
    )
    app = web.Application(middlewares=[error_middleware], client_max_size=32 * 1024**2)
    app[BACKEND] = backend

    async def engine_thread(app: web.Application) -> Any:
        engine.start()
        if warm:  # the runner listens only after this (cleanup_ctx runs in its setup)
            backend.rates = await warm_up(engine)
        yield
        await backend.answers.close()
        await asyncio.get_running_loop().run_in_executor(None, engine.stop)

    app.cleanup_ctx.append(engine_thread)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/prefix_events", events_handler(engine.prefix_events))
    return app


async def health(request: web.Request) -> web.Response:
    rates = request.app[BACKEND].rates
    return web.json_response({"status": "ok", **(rates.report() if rates else {})})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[BACKEND].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def models(request: web.Request) -> web.Response:
    b = request.app[BACKEND]
    # `max_model_len`: prompt + completion; a completion may use what the prompt leaves
    card = {"id": b.model_name, "object": "model", "created": 0, "owned_by": "routegate",
            "max_model_len": b.engine.max_model_len,
            "max_output_tokens": b.engine.max_model_len - 1,
            "capabilities": CAPABILITIES, **(b.rates.report() if b.rates else {})}
    return web.json_response({"object": "list", "data": [card]})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=False)


async def _prompt_ids(b: Backend, req: ParsedRequest) -> list[int]:
    if req.prompt_ids is not None:
        vocab = b.engine.runner.model.config.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt_ids):
            raise bad_request(f"token ids must be in [0, {vocab})", "prompt")
        return req.prompt_ids
    tok = b.engine.tokenizer
    if req.messages is not None:
        try:
            text = b.template.render(req.messages)
        except ChatTemplateError as exc:
            raise bad_request(str(exc), "messages") from exc
        special = False  # the template already wrote BOS where the model wants it
    else:
        text, special = req.prompt_text or "", True
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return tok.encode(text, add_special_tokens=special)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: tok.encode(text, add_special_tokens=special))


def _prefix_tags(request: web.Request, engine: Engine, req: ParsedRequest,
                 prompt_tokens: int) -> tuple[tuple[int, int], ...]:
    """The client's names for this prompt's prefixes, when it asks (prefix_tags.py)."""
    block_chars = block_chars_asked(request.headers)
    text = prompt_text(req.messages) if req.messages is not None else req.prompt_text or ""
    if block_chars is None or not text:
        return ()
    tags, never = prefix_tags(text, req.cache_salt, block_chars, prompt_tokens,
                              engine.config.block_size)
    for tag in never:
        engine.prefix_events.not_held(tag)
    return tags


async def _serve(request: web.Request, *, chat: bool) -> web.StreamResponse:
    b = request.app[BACKEND]
    engine = b.engine
    arrival = engine.clock()
    deadline = deadline_of(request, arrival)
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from exc
    req = parse(body, chat=chat, defaults=b.defaults)
    priority = priority_of(request.headers, body)
    model = body.get("model")
    if model is not None and model != b.model_name:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves "
                       f"{b.model_name!r}", code="model_not_found", param="model")
    vocab = engine.runner.model.config.vocab_size
    if any(not 0 <= t < vocab for t, _ in req.params.logit_bias):
        raise bad_request(f"'logit_bias' token ids must be in [0, {vocab})", "logit_bias")
    key = key_of(request.headers, stream=req.stream)
    if key is not None and b.answers.enabled:  # the tenant's salt scopes the key
        return await b.answers.once((req.cache_salt or "", key), raw, lambda: _generate(
            request, b, req, arrival, deadline, priority))
    return await _generate(request, b, req, arrival, deadline, priority)


async def _generate(request: web.Request, b: Backend, req: ParsedRequest, arrival: float,
                    deadline: float | None, priority: int) -> web.StreamResponse:
    engine, chat = b.engine, req.chat
    prompt_ids = await _prompt_ids(b, req)
    tags = _prefix_tags(request, engine, req, len(prompt_ids))
    request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    # each choice is its own sequence (the prompt's blocks are shared by prefix caching)
    choice_ids = [request_id] if req.n == 1 else [f"{request_id}-{i}" for i in range(req.n)]
    queues: list[asyncio.Queue[RequestOutput]] = []
    try:
        for index, choice_id in enumerate(choice_ids):
            queues.append(engine.add_request(choice_id, prompt_ids,
                                             choice_params(req.params, index), arrival=arrival,
                                             deadline=deadline, priority=priority,
                                             cache_salt=req.cache_salt,
                                             prefix_tags=tags))
    except (QueueFull, RequestRejected) as exc:
        for choice_id in choice_ids[:len(queues)]:  # all of the request or none of it
            engine.abort(choice_id)
        if isinstance(exc, QueueFull):
            raise ApiError(429, f"the server is busy: {exc}", type_="rate_limit_error",
                           code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from exc
        raise ApiError(400, str(exc), code="context_length_exceeded",
                       param="messages" if chat else "prompt") from exc
    builder = ResponseBuilder(request_id, b.model_name, chat=chat, tokenizer=engine.tokenizer)
    parent = inbound_context(request.headers)
    try:
        if req.stream:
            response = await stream(request, b, req, builder, queues)
        else:
            response = await complete(b, builder, queues)
    finally:
        if builder.final is None:  # cancelled, client gone, or failed: free the blocks now
            for choice_id in choice_ids:
                engine.abort(choice_id)
    b.spans.record(parent, "local_backend.request", builder.final, builder.end,
                   {"gen_ai.request.model": b.model_name,
                    "gen_ai.operation.name": "chat" if chat else "text_completion"})
    return response
