"""Nothing a client writes reaches a log line raw: a path, a model name or a header
cannot end the line and forge another, write a terminal escape or a NUL byte.

Every line the gateway logs while it answers generated requests (plain-text lines and
JSON lines alike, formatted as `routegate serve` formats them) is one line of
printable characters."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.log_text import escaped, json_line
from tests.gateway.live_gateway import exchange, live_gateway, statuses

SERVE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # `routegate serve`'s


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter(SERVE_FORMAT))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def logged_lines() -> Iterator[list[str]]:
    """Every record logged under `routegate` (the access log included), formatted."""
    handler, logger = _Lines(), logging.getLogger("routegate")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def assert_one_printable_line_each(lines: list[str]) -> None:
    for line in lines:
        assert line.splitlines() == [line], f"a log line was split: {line!r}"
        assert line.isprintable(), f"a log line carries an unprintable character: {line!r}"


def request(method: bytes, target: bytes, body: bytes = b"", headers: bytes = b"") -> bytes:
    return (method + b" " + target + b" HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
            + headers
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body)


FORGED = ["\n2026-12-03 14:00:00 INFO routegate.access: forged", "\x1b[2J\x1b[31m",
          "\x00", "\r", "\x85", "\u2028", "\u202e", "\x7f", "\\n"]
# arbitrary text, weighted towards what breaks lines
texts = st.one_of(st.text(max_size=40),
                  st.lists(st.sampled_from(FORGED) | st.text(max_size=4), max_size=6)
                  .map("".join))


def test_a_forged_line_in_a_path_is_escaped_in_the_error_line() -> None:
    with live_gateway() as (runner, gateway), logged_lines() as lines:
        answer = runner.run(exchange(gateway.port, request(
            b"GET", b"/v1/x%0a2026-12-03%20INFO%20forged%1b[31m%00")))
    assert statuses(answer) == [404]
    assert_one_printable_line_each(lines)
    error_line = next(line for line in lines if "routegate.errors" in line)
    fields = orjson.loads(error_line.split(": ", 1)[1])
    assert fields["path"] == "/v1/x\n2026-12-03 INFO forged\x1b[31m\x00"
    assert fields["status"] == 404 and fields["method"] == "GET"


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=texts, model=texts, header=st.binary(max_size=30))
def test_no_request_text_reaches_a_log_line_raw(path: str, model: str, header: bytes) -> None:
    # header values: any byte an HTTP/1.1 field value may carry (no CR, LF or NUL)
    value = bytes(b for b in header if b not in b"\r\n\x00")
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    exchanges = [
        request(b"GET", b"/v1/" + quote(path, safe="").encode()),
        request(b"GET", b"/v1/" + b"".join(b"%%%02x" % byte for byte in header)),
        request(b"POST", b"/v1/chat/" + quote(path, safe="/").encode(), body),
        request(b"POST", b"/v1/chat/completions", body, b"x-routegate-ttft-budget-ms: "
                + value + b"\r\nAuthorization: Bearer " + value + b"\r\n"),
        request(b"POST", b"/v1/messages", body, b"x-api-key: " + value + b"\r\n"),
        request(b"POST", b"/v1/responses", orjson.dumps({"model": model, "input": path})),
    ]
    with live_gateway() as (runner, gateway), logged_lines() as lines:
        for raw in exchanges:
            answer = runner.run(exchange(gateway.port, raw))
            assert all(status < 500 for status in statuses(answer)), answer[:300]
    assert lines, "the requests were logged"
    assert_one_printable_line_each(lines)


@given(st.text())
def test_escaped_text_is_one_printable_line_that_reads_back(text: str) -> None:
    out = escaped(text)
    assert out.isprintable() and out.splitlines() in ([out], [])
    assert out.encode().decode("unicode_escape") == text or "\\" in text or not text.isascii()


@given(st.dictionaries(st.text(max_size=5), st.text() | st.integers(-2**63, 2**63 - 1)
                       | st.none(),
                       max_size=4))
def test_a_json_line_is_one_printable_line_of_the_same_fields(fields: dict[str, object]) -> None:
    line = json_line(fields)
    text = line.decode()
    assert text.endswith("\n") and text[:-1].isprintable()
    assert orjson.loads(line) == fields
