"""The Batch API's objects as stored and as OpenAI's API shows them: a file, a batch,
one line's result, and where a batch's tokens ran and what they cost."""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

BatchStatus = Literal["validating", "in_progress", "finalizing", "completed", "failed",
                      "expired", "cancelling", "cancelled"]
FINAL: frozenset[str] = frozenset({"completed", "failed", "expired", "cancelled"})
ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings")
Placement = Literal["dedicated", "shared"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(slots=True)
class FileObject:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str  # batch | batch_output
    tenant: str  # who may read it: files are a tenant's, like its batches
    lines: int = 0
    expires_at: int | None = None  # gone from then on (None: kept until deleted)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "status_details": None,
                "expires_at": self.expires_at}


@dataclass(slots=True)
class Split:
    """Lines, tokens and the ledger's cost of a batch on one kind of capacity."""

    lines: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0


@dataclass(slots=True)
class Report:
    """Where a batch ran and what it cost, in micro-dollars (the ledger's figures: a
    dedicated line at its amortised GPU-hour price), and what every line would have cost
    on the route's cheapest shared target."""

    dedicated: Split = field(default_factory=Split)
    shared: Split = field(default_factory=Split)
    cost_micros: int = 0
    all_shared_cost_micros: int = 0

    def openai(self) -> dict[str, Any]:
        return {"dedicated": asdict(self.dedicated), "shared": asdict(self.shared),
                "cost_micros": self.cost_micros,
                "all_shared_cost_micros": self.all_shared_cost_micros,
                "saving_micros": self.all_shared_cost_micros - self.cost_micros,
                # dedicated hours are paid whether used or not: what the batch saved in
                # per-token spend, against sending every line to the cheapest shared target
                "spend_saving_micros": self.all_shared_cost_micros - self.shared.cost_micros}

    @classmethod
    def of(cls, data: dict[str, Any]) -> Report:
        return cls(Split(**data["dedicated"]), Split(**data["shared"]), data["cost_micros"],
                   data["all_shared_cost_micros"])


@dataclass(slots=True)
class LineResult:
    """One input line's outcome: a line of the output file (2xx) or of the error file."""

    index: int
    custom_id: str | None
    status: int | None  # the HTTP status the line got; None: it was never sent (malformed)
    body: Any  # the response body, or OpenAI's error object
    request_id: str
    placement: Placement | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0
    all_shared_cost_micros: int = 0
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def file_line(self) -> dict[str, Any]:
        """As OpenAI writes it in an output or error file."""
        response = None if self.status is None else {
            "status_code": self.status, "request_id": self.request_id, "body": self.body}
        error = None if self.error_code is None else {
            "code": self.error_code, "message": self.error_message}
        return {"id": f"batch_req_{self.request_id}", "custom_id": self.custom_id,
                "response": response, "error": error}


@dataclass(slots=True)
class Batch:
    id: str
    tenant: str
    key_hash: str | None  # the key that created it: each line runs as that key
    endpoint: str
    input_file_id: str
    completion_window: str
    window_s: float
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    status: BatchStatus = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    times: dict[str, int] = field(default_factory=dict)  # in_progress_at, …: when it got there
    report: Report = field(default_factory=Report)
    output_expires_s: int | None = None  # its output and error files' lifetime

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def openai(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": None if not self.errors else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "expires_at": self.expires_at,
            "request_counts": {"total": self.total, "completed": self.completed,
                               "failed": self.failed},
            "metadata": self.metadata,
            "routegate": self.report.openai(),  # an extension: where it ran, what it cost
        }
        for name in ("in_progress_at", "finalizing_at", "completed_at", "failed_at",
                     "expired_at", "cancelling_at", "cancelled_at"):
            body[name] = self.times.get(name)
        return body

    def stored(self) -> dict[str, Any]:
        data = asdict(self)
        data["report"] = self.report.openai()
        return data

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> Batch:
        data = dict(data)
        data["report"] = Report.of(data["report"])
        return cls(**data)
