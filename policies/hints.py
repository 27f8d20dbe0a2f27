""""Did you mean …?" — the likely fix for a misspelt key, name or value."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence

from pydantic import BaseModel


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """A hint naming the closest candidate, or None when nothing is close."""
    options = sorted(set(candidates))
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`?"
    return None


def _unwrap(annotation: object) -> object:
    """`X | None` and `Annotated[X, ...]` → X."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation


def annotation_at(root: type[BaseModel], path: Sequence[str | int]) -> object | None:
    """The declared type of the field at `path` (dict keys and list indices step inside)."""
    annotation: object = root
    for segment in path:
        annotation = _unwrap(annotation)
        origin = typing.get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(segment))
            if field is None:
                return None
            annotation = field.annotation
        elif origin is dict:
            annotation = typing.get_args(annotation)[1]
        elif origin is list:
            annotation = typing.get_args(annotation)[0]
        else:
            return None
    return _unwrap(annotation)


def field_names_at(root: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The keys allowed in the mapping at `path` (empty when it is not a model)."""
    annotation = annotation_at(root, path)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def literal_values_at(root: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The allowed values when the field at `path` is a `Literal[...]` (or a list of one)."""
    annotation = annotation_at(root, path)
    if typing.get_origin(annotation) is list:
        annotation = _unwrap(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is typing.Literal:
        return [str(value) for value in typing.get_args(annotation)]
    return []
