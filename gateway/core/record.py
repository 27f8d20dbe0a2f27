"""The request record: everything one request did, as plain typed values.

The pipeline fills one `RequestRecord` as the request runs — who asked, what was
asked for, admission's estimate, what the router decided, each attempt (target, clock
marks, outcome), usage, the status sent, the cost in integer micro-dollars (set once,
by settlement), the error and its metric reason, and the timing split. It is where
every fact about the request lives, once: the request context (`context.py`) holds
only live objects, and the pipeline, the plug-ins (settlement, routing statistics,
the cache), the observers and telemetry read facts here, as they are written. Once
it is final (`Telemetry.finish`), everything that reports on the request reads it:
metrics, the access log, the dashboard's sample, the `Server-Timing` figures and the
spans (`gateway/telemetry/tracing/span_build.py`), so a number shown anywhere is the
same number everywhere.

Everything here is a plain value (str, int, float, bool, None, lists and tuples of
them), so a finished record travels to the trace exporter process as it is
(`plain()` / `from_plain()`, through `marshal`). The clock marks behind the timing
split (`timings`) stay in this process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from time import time_ns
from typing import Any

from gateway.core.timing import RequestTimings, TimingSplit

# A span's error, as a span reports it: the exception's class name (or the failure's
# statement) and a short description, never more than `ERROR_TEXT_CHARS` of it.
ERROR_TEXT_CHARS = 200


@dataclass(slots=True, eq=False)
class TraceIds:
    """This request's place in a distributed trace (W3C trace context)."""

    trace_id: int
    span_id: int  # the gateway's root span
    parent_id: int = 0  # the caller's span (0: none)
    parent_remote: bool = False
    sampled: bool = False  # recorded and exported
    flags: int = 0  # W3C trace flags as sent upstream
    trace_state: tuple[tuple[str, str], ...] = ()
    root_attributes: tuple[tuple[str, Any], ...] = ()  # what the sampler added

    def traceparent(self, span_id: int) -> str:
        return f"00-{self.trace_id:032x}-{span_id:016x}-{self.flags:02x}"

    def tracestate(self) -> str | None:
        return ",".join(f"{k}={v}" for k, v in self.trace_state) if self.trace_state else None


@dataclass(slots=True, eq=False)
class StepRecord:
    """One step of the gateway's own work (auth, rate limit, route, a queue wait)."""

    name: str  # the span name: routegate.auth, routegate.rate_limit, …
    start_ns: int
    end_ns: int = 0
    error_type: str | None = None
    error_text: str | None = None
    backend: str | None = None  # a queue wait's backend
    waited_ms: float | None = None  # a queue wait's own figure


@dataclass(slots=True, eq=False)
class AttemptRecord:
    """One try on one target, from the moment it has its queue slot; `error` is None for
    the attempt that answered. The request's attempts are this list and no other: the
    live side of the one in progress is `core.attempt_facts.Attempt`."""

    key: str  # backend/model, as the policy names the target
    backend: str
    model: str  # the policy's model name
    upstream_model: str  # the name the backend knows it by
    system: str  # the backend's API: openai | anthropic
    number: int  # 1 for the first attempt of the request
    start_ns: int = 0
    end_ns: int = 0
    first_token_ns: int = 0
    span_id: int = 0  # the CLIENT span's id, sent upstream in traceparent (0: not traced)
    status: int | None = None  # the backend's HTTP status, when it answered
    error: str | None = None  # what failed (the failure's statement, for the client)
    error_type: str | None = None  # for the span: an exception class or the statement
    failure: str | None = None  # its kind's metric reason (`failures.UpstreamFailure`)
    deadline_ms: int | None = None  # the budget left as it was sent
    ended: bool = False
    replica: str | None = None  # host:port of the fleet replica it was sent to

    @property
    def answered(self) -> bool:
        return self.error is None and self.ended


# The fields of each record in the order `plain()` writes them (the exporter process
# reads them back by the same tuples).
_STEP_FIELDS = StepRecord.__slots__
_ATTEMPT_FIELDS = AttemptRecord.__slots__
_IDS_FIELDS = TraceIds.__slots__


@dataclass(slots=True, eq=False)
class RequestRecord:
    # identity -----------------------------------------------------------------
    request_id: str
    method: str
    path: str
    client: str | None = None  # the peer address
    start_ns: int = field(default_factory=time_ns)
    end_ns: int = 0
    trace: TraceIds | None = None  # None: tracing is off
    inbound_trace_id: str | None = None  # the caller's trace id when tracing is off
    tenant: str | None = None
    auth: str | None = None  # key | anonymous | unknown_key
    priority: str = "normal"  # the tenant's queue band
    batch_id: str | None = None  # a Batch API line: the batch it belongs to
    # the request, as parsed -----------------------------------------------------
    requested_model: str = ""  # a route name or "backend/model" ("": not parsed yet)
    stream: bool = False
    client_wants_usage: bool = False  # a stream's `stream_options.include_usage`
    # the route or target key serving `requested_model` for this caller (its tenant's
    # `routes` applied; None: not parsed yet)
    served_model: str | None = None
    operation: str | None = None  # GenAI operation: chat, text_completion, embeddings
    max_tokens: int | None = None
    temperature: float | None = None
    # admission: the input tokens it estimated and reserved (None: none estimated),
    # what the tenant may still spend (None: no budget)
    estimated_input_tokens: int | None = None
    budget_left_micros: int | None = None
    # the decision --------------------------------------------------------------
    route: str | None = None
    decided_backend: str | None = None  # the primary's (a fallback changes `backend`)
    reason: str | None = None  # objective | budget_miss | static
    decision_id: str | None = None
    predicted_ttft_ms: float | None = None
    predicted_total_ms: float | None = None
    predicted_cost_micros: int | None = None
    candidates: tuple[str, ...] = ()  # only when traced
    excluded: tuple[str, ...] = ()  # "key: reason", only when traced
    # what happened -------------------------------------------------------------
    steps: list[StepRecord] = field(default_factory=list)  # only when traced
    attempts: list[AttemptRecord] = field(default_factory=list)  # the request's only list
    response_model: str | None = None
    response_id: str | None = None
    input_tokens: int | None = None
    cached_input_tokens: int | None = None  # of input_tokens, read from the prefix cache
    output_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)
    cost_micros: int | None = None  # what settlement charged (the ledger's figure)
    cache: str | None = None  # hit | miss | bypass, on a route with a response cache
    # sent to the client (0: not known yet; 499: it went away; 500: unexpected), set as
    # it is known, final before settlement and the observers
    status: int = 0
    error_code: str | None = None
    # why a request refused before any attempt is counted: rate_limit | budget | shed
    rejection: str | None = None
    rejected_limit: str | None = None  # rpm | tpm | budget | …, for rate limits
    # content: only when the policy records it, and only on a sampled request
    keeps_content: bool = False
    prompt: str | None = None
    completion: str | None = None
    # the timing split, fixed by `Telemetry.finish` ------------------------------
    gw_ms: float = 0.0
    queue_ms: float = 0.0
    upstream_ms: float = 0.0
    total_ms: float = 0.0
    ttft_ms: float | None = None
    inference_ms: float | None = None
    # not sent to the exporter process: the clock marks and the split they give
    timings: RequestTimings | None = None
    split: TimingSplit | None = None

    @property
    def sampled(self) -> bool:
        trace = self.trace
        return trace is not None and trace.sampled

    @property
    def trace_id(self) -> str | None:
        trace = self.trace
        return f"{trace.trace_id:032x}" if trace is not None else self.inbound_trace_id

    @property
    def attempt(self) -> AttemptRecord | None:
        """The latest attempt: the one being tried, or the one that answered."""
        return self.attempts[-1] if self.attempts else None

    @property
    def backend(self) -> str | None:
        attempt = self.attempt
        return attempt.backend if attempt is not None else self.decided_backend

    @property
    def model(self) -> str | None:
        attempt = self.attempt
        return attempt.model if attempt is not None else None

    @property
    def cost_usd(self) -> float | None:
        """The settled cost in USD, for displays (accounting stays in micro-dollars)."""
        return self.cost_micros / 1e6 if self.cost_micros is not None else None

    def step(self, name: str) -> StepMark:
        """`with record.step("routegate.auth"):` — a traced step's clock marks; a no-op
        (one shared object) when the request is not traced."""
        trace = self.trace  # `sampled`, read without a call: three steps a request
        return StepMark(self, name) if trace is not None and trace.sampled else UNTRACED_STEP

    def fallbacks(self) -> list[tuple[str, str]]:
        """(from backend, to backend) for each attempt on another target than the one
        before (the same target again is a retry, not a fallback)."""
        out = []
        for before, after in zip(self.attempts, self.attempts[1:], strict=False):
            if before.key != after.key:
                out.append((before.backend, after.backend))
        return out

    # the exporter process's form ------------------------------------------------
    def plain(self) -> tuple[Any, ...]:
        """What the trace exporter process needs of this record, as nested tuples of
        plain values (what `marshal` writes)."""
        trace = self.trace
        return (_exported(self), _ids(trace) if trace else None,
                [_step(s) for s in self.steps], [_attempt(a) for a in self.attempts])

    @classmethod
    def from_plain(cls, plain: tuple[Any, ...]) -> RequestRecord:
        """A record as the exporter process gets it (what its spans need; the rest is
        left at the defaults)."""
        scalars, trace, steps, attempts = plain
        record = cls(request_id="", method="", path="")
        for name, value in zip(_EXPORTED, scalars, strict=True):
            setattr(record, name, value)
        record.trace = TraceIds(*trace) if trace is not None else None
        record.steps = [StepRecord(*values) for values in steps]
        record.attempts = [AttemptRecord(*values) for values in attempts]
        return record


# What the spans are built from (`span_build.py`), in `plain()`'s order: one C call
# per object instead of a getattr a field.
_EXPORTED = (
    "request_id", "method", "path", "start_ns", "end_ns", "tenant", "requested_model",
    "stream", "operation", "max_tokens", "temperature", "route", "decided_backend", "reason",
    "decision_id", "predicted_ttft_ms", "predicted_total_ms", "predicted_cost_micros",
    "candidates", "excluded", "response_model", "response_id", "input_tokens",
    "output_tokens", "finish_reasons", "cost_micros", "cache", "status", "error_code",
    "prompt", "completion", "gw_ms", "queue_ms", "upstream_ms", "total_ms", "ttft_ms",
    "inference_ms", "batch_id",
)
_exported = attrgetter(*_EXPORTED)
_ids = attrgetter(*_IDS_FIELDS)
_step = attrgetter(*_STEP_FIELDS)
_attempt = attrgetter(*_ATTEMPT_FIELDS)


class StepMark:
    """The clock marks of one traced step (a class, not @contextmanager: a generator
    per step is measurably dearer on the request path)."""

    __slots__ = ("_step",)

    def __init__(self, record: RequestRecord | None, name: str) -> None:
        self._step: StepRecord | None = None
        if record is not None:
            self._step = StepRecord(name, time_ns())
            record.steps.append(self._step)

    def __enter__(self) -> StepMark:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        step = self._step
        if step is None:
            return
        step.end_ns = time_ns()
        if exc is not None:
            step.error_type = type(exc).__name__
            step.error_text = str(exc)[:ERROR_TEXT_CHARS]


UNTRACED_STEP = StepMark(None, "")
