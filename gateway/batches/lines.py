"""An input file's lines as requests: each either a request body to run or the reason it
cannot run (an error record in the error file, never a dropped line)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class InputLine:
    index: int  # 0-based among the file's non-blank lines
    custom_id: str | None
    body: dict[str, Any] | None  # None: malformed, see `error`
    error: str | None = None
    code: str | None = None


def input_lines(data: bytes, endpoint: str) -> list[InputLine]:
    found: list[InputLine] = []
    seen: set[str] = set()
    number = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        line = _line(number, raw, endpoint, seen)
        if line.custom_id is not None:
            seen.add(line.custom_id)
        found.append(line)
        number += 1
    return found


def _line(index: int, raw: bytes, endpoint: str, seen: set[str]) -> InputLine:
    where = f"Line {index + 1}"
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return InputLine(index, None, None, f"{where} is not valid JSON ({exc}).",
                         "invalid_json")
    if not isinstance(item, dict):
        return InputLine(index, None, None, f"{where} is not a JSON object.", "invalid_json")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return InputLine(index, None, None, f"{where} has no custom_id (a non-empty string).",
                         "missing_custom_id")
    if custom_id in seen:
        return InputLine(index, custom_id, None, f"{where} repeats custom_id '{custom_id}'; "
                         "each line needs its own.", "duplicate_custom_id")
    if item.get("method") != "POST":
        return InputLine(index, custom_id, None, f"{where}: method must be POST.",
                         "invalid_method")
    if item.get("url") != endpoint:
        return InputLine(index, custom_id, None, f"{where}: url must be the batch's "
                         f"endpoint {endpoint}; got {item.get('url')!r}.", "invalid_url")
    body = item.get("body")
    if not isinstance(body, dict):
        return InputLine(index, custom_id, None, f"{where}: body must be a JSON object.",
                         "invalid_body")
    if body.get("stream") is True:
        return InputLine(index, custom_id, None, f"{where}: a batch line cannot stream "
                         "(remove `stream`).", "invalid_body")
    return InputLine(index, custom_id, body)
