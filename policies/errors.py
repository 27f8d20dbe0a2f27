"""`PolicyError`: every problem of a policy file, each with file, line, column and field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyIssue:
    """One problem (or warning) at one place of a policy file. Lines and columns count from 1."""

    message: str
    source: str = "<policy>"
    line: int | None = None
    column: int | None = None
    field_path: str | None = None
    hint: str | None = None

    def render(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where}: "
        if self.field_path:
            text += f"{self.field_path}: "
        text += self.message
        if self.hint:
            text += f" (hint: {self.hint})"
        return text

    def __str__(self) -> str:
        return self.render()

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source, "line": self.line, "column": self.column,
            "field": self.field_path, "message": self.message, "hint": self.hint,
        }


class PolicyError(Exception):
    """A policy file that cannot be used.

    Holds every issue found (`issues`, in file order); `str()` renders them all,
    one per line. The first issue's parts stay reachable as attributes for code
    that only needs one location.
    """

    def __init__(self, message: str = "", *, source: str = "<policy>", line: int | None = None,
                 column: int | None = None, field_path: str | None = None,
                 hint: str | None = None, issues: Sequence[PolicyIssue] = ()) -> None:
        if not issues:
            issues = (PolicyIssue(message, source, line, column, field_path, hint),)
        self.issues: tuple[PolicyIssue, ...] = tuple(issues)
        first = self.issues[0]
        self.message = first.message
        self.source = first.source
        self.line = first.line
        self.column = first.column
        self.field_path = first.field_path
        self.hint = first.hint
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(issue.render() for issue in self.issues)
