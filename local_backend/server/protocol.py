"""OpenAI request bodies → prompt + `SamplingParams`; engine outputs → OpenAI response bodies."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from local_backend.chat_template import TEXT_PARTS
from local_backend.engine.loop import RequestOutput
from local_backend.engine.params import SamplingParams
from local_backend.engine.sampler import TokenLogprob
from local_backend.engine.sequence import Timings
from local_backend.generation_config import GenerationConfig
from local_backend.server.errors import ApiError, bad_request
from local_backend.tokenizer import Tokenizer

DEFAULT_CHAT_MAX_TOKENS = 512
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy default for /v1/completions
MAX_LOGPROBS = 20  # alternatives per token; more is a 400, as with OpenAI (not silently fewer)
MAX_CHOICES = 16  # `n`: each choice is a sequence in the running batch

# Every field this server acts on. Anything else is refused by name, never ignored: a
# caller asking for tools, JSON output or a sampler setting this engine lacks
# (`min_p`, `repetition_penalty`, ...) must not get a plain answer unawares, and the
# refusal (`unsupported_parameter`) lets a gateway try another backend.
_SAMPLING = frozenset({"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stop",
                       "stream", "stream_options", "seed", "presence_penalty",
                       "frequency_penalty", "logit_bias", "user", "ignore_eos", "logprobs",
                       "priority",  # the band (request_priority.py), as vLLM takes it
                       "cache_salt"})  # seeds the prefix cache's block hashes, as vLLM
CHAT_FIELDS = _SAMPLING | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                           "tool_choice", "parallel_tool_calls", "response_format",
                           "modalities", "metadata", "store"}
COMPLETION_FIELDS = _SAMPLING | {"prompt", "echo", "best_of"}
# Fields accepted only with the value that asks for nothing this server lacks.
_NEUTRAL: dict[str, Any] = {"tools": [], "tool_choice": "none",
                            "response_format": {"type": "text"}, "modalities": ["text"],
                            "store": False}
# What this server can do, as `/v1/models` reports it (the gateway routes by it).
CAPABILITIES = {"tools": False, "vision": False, "json_mode": False, "json_schema": False,
                "logprobs": True, "audio": False, "n": MAX_CHOICES}


def unsupported(param: str, message: str, *, code: str = "unsupported_parameter") -> ApiError:
    return ApiError(400, message, code=code, param=param)


def refuse_unsupported(body: dict[str, Any], *, chat: bool) -> None:
    """400 naming the first field (or content part) this server cannot honour."""
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for key, value in body.items():
        if key not in known:
            raise unsupported(key, f"Unsupported parameter: '{key}' is not supported by "
                              "this server.")
        neutral = _NEUTRAL.get(key)
        if neutral is not None and value is not None and value != neutral:
            raise unsupported(key, f"Unsupported value: '{key}' can only be {neutral!r} "
                              "on this server.", code="unsupported_value")
    messages = body.get("messages") if chat else None
    for index, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for position, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in TEXT_PARTS:
                raise unsupported(f"messages[{index}].content[{position}]",
                                  f"Unsupported value: content parts of type '{kind}' "
                                  "are not supported by this server (text only).",
                                  code="unsupported_value")


@dataclass(frozen=True)
class ParsedRequest:
    chat: bool
    messages: list[dict[str, Any]] | None
    prompt_text: str | None
    prompt_ids: list[int] | None
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo_logprobs: bool  # chat-style logprobs (chat) or legacy (completions)
    n: int = 1  # choices, each generated as its own sequence from the same prompt
    cache_salt: str | None = None  # prefix-cache blocks are shared only under one salt


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise bad_request(f"'{key}' must be a number between {lo} and {hi}", key)
    return float(value)


def _int(
    body: dict[str, Any], key: str, default: int | None, lo: int, hi: int | None = None
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (
        hi is not None and value > hi
    ):
        bounds = f"between {lo} and {hi}" if hi is not None else f"≥ {lo}"
        raise bad_request(f"'{key}' must be an integer {bounds}", key)
    return value


def _logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """{"token id": bias in [-100, 100]} → pairs; ids are checked against the vocab later."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    message = "'logit_bias' must map token ids to numbers between -100 and 100"
    if not isinstance(value, dict):
        raise bad_request(message, "logit_bias")
    pairs: list[tuple[int, float]] = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit()) or isinstance(bias, bool) or not (
            isinstance(bias, int | float) and -100 <= bias <= 100
        ):
            raise bad_request(message, "logit_bias")
        pairs.append((int(key), float(bias)))
    return tuple(pairs)


def parse(body: Any, *, chat: bool, defaults: GenerationConfig | None = None) -> ParsedRequest:
    d = defaults or GenerationConfig()
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    refuse_unsupported(body, chat=chat)
    n = int(_int(body, "n", 1, 1, MAX_CHOICES) or 1)
    stop = body.get("stop")
    # A list only: tuple() of a number raises (a 500), and of an object takes its keys.
    listed: list[Any] = stop if isinstance(stop, list) else [] if stop is None else [None]
    stops: tuple[Any, ...] = (stop,) if isinstance(stop, str) else tuple(listed)
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise bad_request("'stop' must be a string or up to 4 non-empty strings", "stop")
    messages = prompt_text = prompt_ids = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise bad_request("'messages' must be a non-empty list of {role, content}", "messages")
        max_tokens = _int(body, "max_completion_tokens", None, 1) or _int(
            body, "max_tokens", DEFAULT_CHAT_MAX_TOKENS, 1
        )
        top_logprobs = _int(body, "top_logprobs", 0, 0, MAX_LOGPROBS)
        wants_logprobs = _flag(body, "logprobs")
        if top_logprobs and not wants_logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = top_logprobs if wants_logprobs else None
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            prompt_text = prompt
        elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            prompt_ids = list(prompt)
        else:
            raise bad_request("'prompt' must be a non-empty string or token ids", "prompt")
        max_tokens = _int(body, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS, 1)
        # Refused rather than ignored: a caller scoring text with echo + logprobs, or
        # expecting the best of several samples, would get a different answer unawares.
        if _flag(body, "echo"):
            raise bad_request("'echo' is not supported by this server", "echo")
        if _int(body, "best_of", 1, 1) != 1:
            raise bad_request("only best_of=1 is supported", "best_of")
        logprobs = _int(body, "logprobs", None, 0, MAX_LOGPROBS)
    options = body.get("stream_options") or {}
    params = SamplingParams(
        max_tokens=int(max_tokens or 1),
        temperature=_number(body, "temperature", d.temperature, 0.0, 2.0),
        # OpenAI accepts 0 (the sampler then keeps only the most likely token).
        top_p=_number(body, "top_p", d.top_p, 0.0, 1.0),
        top_k=int(_int(body, "top_k", d.top_k, 0) or 0),
        seed=_int(body, "seed", None, -(2**63)),
        stop=stops,
        ignore_eos=_flag(body, "ignore_eos"),
        logprobs=logprobs,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body),
    )
    return ParsedRequest(
        chat=chat, messages=messages, prompt_text=prompt_text, prompt_ids=prompt_ids,
        params=params, stream=_flag(body, "stream"),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        echo_logprobs=logprobs is not None,
        n=n, cache_salt=_salt(body),
    )


MAX_SALT_CHARS = 256


def _salt(body: dict[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not 0 < len(salt) <= MAX_SALT_CHARS:
        raise bad_request(f"'cache_salt' must be a non-empty string of at most "
                          f"{MAX_SALT_CHARS} characters", "cache_salt")
    return salt


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """The sampling of choice `index`: with a seed, its own (seed + index), so the choices
    differ and each is reproducible on its own (choice i of a seeded request is what
    `n: 1` with seed + i gives)."""
    if index == 0 or params.seed is None:
        return params
    return replace(params, seed=params.seed + index)


def combined(request_id: str, finals: list[RequestOutput]) -> RequestOutput:
    """One request's final output from its choices' (`n` > 1): the prompt counted once,
    completion tokens and preemptions summed, and its instants spanning them all (queued
    from the earliest arrival, first token the earliest, last token the latest)."""
    if len(finals) == 1:
        return finals[0]
    timings = [f.timings for f in finals if f.timings is not None]

    def earliest(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    def latest(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    span = Timings(
        arrival=min(t.arrival for t in timings),
        first_scheduled=earliest([t.first_scheduled for t in timings]),
        first_token=earliest([t.first_token for t in timings]),
        last_token=latest([t.last_token for t in timings]),
        finished=latest([t.finished for t in timings]),
    ) if timings else None
    last = max(finals, key=lambda f: f.time)
    return RequestOutput(
        request_id=request_id, text="", token_ids=[],
        time=last.time, finished=True, finish_reason=last.finish_reason,
        prompt_tokens=finals[0].prompt_tokens, cached_tokens=finals[0].cached_tokens,
        completion_tokens=sum(f.completion_tokens for f in finals),
        preemptions=sum(f.preemptions for f in finals), timings=span)


def _flag(body: dict[str, Any], name: str) -> bool:
    """A boolean field: `"stream": "false"` is refused, not read as true."""
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false", name)
    return value


def usage(final: RequestOutput) -> dict[str, Any]:
    return {
        "prompt_tokens": final.prompt_tokens,
        "completion_tokens": final.completion_tokens,
        "total_tokens": final.prompt_tokens + final.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": final.cached_tokens},
    }


def logprobs_body(tokenizer: Tokenizer, items: list[TokenLogprob], *, chat: bool) -> Any:
    if not items:
        return None
    if chat:
        def entry(token_id: int, lp: float) -> dict[str, Any]:
            text = tokenizer.decode([token_id])
            return {"token": text, "logprob": lp, "bytes": list(tokenizer.token_bytes(token_id))}

        return {"content": [
            {**entry(i.token_id, i.logprob), "top_logprobs": [entry(t, lp) for t, lp in i.top]}
            for i in items
        ]}
    return {
        "tokens": [tokenizer.decode([i.token_id]) for i in items],
        "token_logprobs": [i.logprob for i in items],
        "top_logprobs": [{tokenizer.decode([t]): lp for t, lp in i.top} for i in items],
    }


class ResponseBuilder:
    """Shapes one request's outputs as chat.completion(.chunk) or text_completion objects."""

    def __init__(self, request_id: str, model: str, *, chat: bool, tokenizer: Tokenizer) -> None:
        self.id, self.model, self.chat, self.tokenizer = request_id, model, chat, tokenizer
        self.created = int(time.time())
        self.final: RequestOutput | None = None  # set when the request finishes
        self.end = 0.0  # monotonic instant the response was completed

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind + (".chunk" if chunk and self.chat else ""),
                "created": self.created, "model": self.model}

    def full(self, choices: list[tuple[str, RequestOutput, list[TokenLogprob]]],
             final: RequestOutput, metrics: dict[str, Any]) -> dict[str, Any]:
        """The whole response: (text, final output, logprobs) per choice, in order;
        `final`: the request's (`combined`)."""
        shaped = []
        for index, (text, last, lps) in enumerate(choices):
            choice: dict[str, Any] = {
                "index": index, "logprobs": logprobs_body(self.tokenizer, lps, chat=self.chat),
                "finish_reason": client_finish_reason(last.finish_reason)}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            shaped.append(choice)
        return {**self._envelope(False), "choices": shaped, "usage": usage(final),
                "metrics": metrics}

    def chunk(self, output: RequestOutput | None, *, first: bool = False,
              index: int = 0) -> dict[str, Any]:
        text = output.text if output is not None else ""
        reason = client_finish_reason(output.finish_reason) if output is not None else None
        lps = output.logprobs if output is not None else []
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs_body(
            self.tokenizer, lps, chat=self.chat), "finish_reason": reason}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text else {})
        else:
            choice["text"] = text
        return {**self._envelope(True), "choices": [choice]}

    def usage_chunk(self, final: RequestOutput, metrics: dict[str, Any]) -> dict[str, Any]:
        return {**self._envelope(True), "choices": [], "usage": usage(final), "metrics": metrics}


def client_finish_reason(reason: str | None) -> str | None:
    """The engine's reason as OpenAI's API words it: a choice cut short by the request's
    deadline (`x-routegate-deadline-ms`) ends as "length", cut at a limit as `max_tokens`
    cuts it (the server's own metrics keep the label "deadline")."""
    return "length" if reason == "deadline" else reason
