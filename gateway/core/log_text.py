"""Text from a request or a backend, made safe to put in a log line.

A path, a model name, a header or a backend's error message is someone else's text.
Written as it came it can end the line and forge the next one (`%0a` in a path
decodes to a newline), move the cursor or recolour a terminal (ESC), or cut the line
short for tools that stop at NUL. Two ways out, one for each kind of line:

- `escaped(text)` for a plain-text line: every character that does not print on one
  line (controls, line and paragraph separators, format characters such as bidi
  overrides) and the backslash itself become backslash escapes (`\\n`, `\\x1b`,
  `\\u2028`, `\\\\`), so what is logged reads back unambiguously;
- `json_line(fields)` for a structured line (the access log, error lines): orjson
  escapes C0 controls; this escapes what else does not print (DEL, the C1 controls,
  of which `\\x85` ends a line for Python's `splitlines`, the Unicode separators and
  format characters).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# JSON leaves these raw: DEL and everything past ASCII (only the unprintable are escaped)
_PAST_ASCII = re.compile("[^\x00-\x7e]")


def escaped(text: str) -> str:
    """`text` with everything that is not printable on one line, and `\\`, escaped."""
    if text.isprintable() and "\\" not in text:
        return text  # the usual case: one C-level scan
    return "".join(_escape_char(char) for char in text)


def _escape_char(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char.isprintable():
        return char
    code = ord(char)
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def json_line(fields: dict[str, Any]) -> bytes:
    """`fields` as one JSON object and a newline, with nothing raw that could end the
    line or reach a terminal as a control."""
    line = orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE)
    if line.isascii() and line.find(b"\x7f") < 0:  # `find`: see gateway/core/sse.py
        return line  # the usual case: two C-level scans
    return _PAST_ASCII.sub(_json_escape, line.decode()).encode()


def _json_escape(found: re.Match[str]) -> str:
    char = found.group()
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON spells it
    return f"\\u{0xd800 + (code >> 10):04x}\\u{0xdc00 + (code & 0x3ff):04x}"


def json_text(fields: dict[str, Any]) -> str:
    """`json_line` as a str without its newline, for a `logging` message."""
    return json_line(fields)[:-1].decode()
