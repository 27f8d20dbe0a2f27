"""`Incapable`: a backend saying "this model cannot do that" rather than "the request is wrong".

Produced where the upstream's reply is read; read by routing (which remembers it per
target) and by the pipeline (which tries the next candidate)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Incapable:
    """A backend's 4xx that means "this model cannot do that", not "the request is
    wrong": another candidate may serve it, and routing remembers it for the target."""

    code: str  # context_length_exceeded | unsupported_parameter | unsupported_value
    param: str | None  # the field it named (`tools`, `response_format`, `messages`)
    message: str  # the backend's own words, for the client if no candidate can

    @property
    def context_exceeded(self) -> bool:
        return self.code == CONTEXT_LENGTH_EXCEEDED


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
