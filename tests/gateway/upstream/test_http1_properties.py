"""Generated misbehaving backends against the backend client.

- Isolation: each request carries its own secret and the backend answers it with that
  secret, framed in a generated way (interim 1xx heads, length, chunked or ended by the
  close, compressed, split anywhere, junk after the body, a late second answer, an early
  close or reset, a bad chunk size); no answer ever holds another request's secret, and
  every answer that was framed correctly arrives whole.
- Robustness (a protocol fuzzer for the response parser): a mutated response ends in an
  answer or an `aiohttp.ClientError` within the timeouts, never another exception, and
  the next request on the same client is answered correctly.

A late answer can only be told apart while the connection is idle: one the backend sends
after the next request went out on the same connection is, for HTTP/1.1, that request's
answer. So each request here is sent once the backend has finished the one before.
"""

from __future__ import annotations

import asyncio
import gzip
import re
from dataclasses import dataclass

import aiohttp
import brotli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.deadline import Timeouts
from gateway.upstream.http1 import Http1Client
from tests.fakes.raw_backend import CLOSE, RESET, Pause, Piece, RawBackend

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[no-redef,unused-ignore]

QUICK = Timeouts(connect_s=1.0, first_byte_s=0.2, total_s=0.6)
SECRET = re.compile(rb"SECRET-(\d\d)-")
INTERIM = (b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 102 Processing\r\n\r\n",
           b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
ENCODERS = {"identity": bytes, "gzip": gzip.compress,
            "br": lambda data: bytes(brotli.compress(data)),
            "zstd": lambda data: bytes(zstd.compress(data))}
# what follows a whole answer; the first three leave it intact for the next request
CLEAN_ENDS = ("nothing", "late junk", "close")
ENDS = (*CLEAN_ENDS, "junk with the body", "late second answer", "cut short",
        "reset", "bad chunk size")


@dataclass(frozen=True)
class Plan:
    interim: tuple[bytes, ...]
    framing: str  # length | chunked | close
    encoding: str
    end: str
    junk: bytes
    cuts: tuple[int, ...]  # where the bytes are split into separate writes

    @property
    def clean(self) -> bool:
        return self.end in CLEAN_ENDS


plans = st.builds(
    Plan, interim=st.lists(st.sampled_from(INTERIM), max_size=3).map(tuple),
    framing=st.sampled_from(("length", "chunked", "close")),
    encoding=st.sampled_from(tuple(ENCODERS)), end=st.sampled_from(ENDS),
    junk=st.binary(max_size=24), cuts=st.lists(st.integers(1, 600), max_size=4).map(tuple))


def secret_of(n: int) -> bytes:
    return b"SECRET-%02d-" % n


def framed(body: bytes, plan: Plan) -> bytes:
    data = ENCODERS[plan.encoding](body)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    if plan.encoding != "identity":
        head += b"Content-Encoding: %b\r\n" % plan.encoding.encode()
    if plan.framing == "length":
        return head + b"Content-Length: %d\r\n\r\n%b" % (len(data), data)
    if plan.framing == "close":
        return head + b"\r\n" + data
    middle = max(1, len(data) // 2)
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(part), part)
                      for part in (data[:middle], data[middle:]) if part)
    if plan.end == "bad chunk size":
        chunks = chunks[:len(chunks) // 2] + b"\r\nzz\r\n"
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


def split(data: bytes, cuts: tuple[int, ...]) -> list[Piece]:
    pieces: list[Piece] = []
    start = 0
    for cut in sorted({min(cut, len(data)) for cut in cuts}):
        pieces += [data[start:cut], Pause(0.001)]
        start = cut
    return [*pieces, data[start:]]


def script(plan_of: dict[int, Plan]) -> object:
    def answer(request: bytes) -> list[Piece]:
        found = SECRET.search(request)
        assert found is not None
        n = int(found.group(1))
        plan = plan_of[n]
        body = b'{"answer": "%b", "padding": "%b"}' % (secret_of(n), b"x" * 40)
        whole = b"".join(plan.interim) + framed(body, plan)
        end = plan.end
        if end == "cut short":
            return [*split(whole[:len(whole) * 3 // 4], plan.cuts), CLOSE]
        if end == "junk with the body":
            return split(whole + plan.junk + framed(body, plan), plan.cuts)
        tail: list[Piece] = []
        if end == "late junk":
            tail = [Pause(0.002), plan.junk or b"\r\n"]
        elif end == "late second answer":
            tail = [Pause(0.002), framed(body, plan)]
        elif end == "reset":
            tail = [RESET]
        if plan.framing == "close" or end == "close":
            tail.append(CLOSE)
        return [*split(whole, plan.cuts), *tail]
    return answer


async def isolation(plan_list: list[Plan]) -> None:
    plan_of = dict(enumerate(plan_list))
    backend = RawBackend(script(plan_of))  # type: ignore[arg-type]
    await backend.start()
    client = Http1Client(backend.url, max_connections=1, timeouts=QUICK)
    try:
        for n, plan in plan_of.items():
            body: bytes | None = None
            try:
                response = await client.post("/x", b'{"secret": "%b"}' % secret_of(n))
                try:
                    body = await response.read()
                finally:
                    response.release()
            except aiohttp.ClientError:
                pass
            if body is not None:
                assert set(SECRET.findall(body)) <= {b"%02d" % n}, (n, plan, body)
            if (plan.clean and plan.framing != "close") or plan.end == "nothing":
                assert body is not None and secret_of(n) in body, (n, plan, body)
            await backend.until_answered(n + 1)  # the backend is done (see the docstring)
            await asyncio.sleep(0.005)
    finally:
        await client.close()
        await backend.stop()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan_list=st.lists(plans, min_size=2, max_size=6))
def test_no_answer_ever_reaches_a_request_it_was_not_sent_for(plan_list: list[Plan]) -> None:
    asyncio.run(asyncio.wait_for(isolation(plan_list), 10.0))


# -- the fuzzer -----------------------------------------------------------------------

SEEDS = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 22\r\n\r\n"
    + gzip.compress(b"{}", mtime=0),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
    b"2;ext=1\r\n{}\r\n0\r\nTrailer: x\r\n\r\n",
)
TOKENS = (b"\r\n", b"\n", b"\r", b"\x00", b":", b" ", b"HTTP/1.1 ", b"100 Continue",
          b"Content-Length: ", b"Transfer-Encoding: chunked", b"Content-Encoding: br",
          b"Content-Encoding: zstd", b"Content-Encoding: deflate", b"Connection: close",
          b"ffffffff", b"-1", b"0\r\n\r\n", b"\xff\xfe", b"99999999999999999999")


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(("insert", "delete", "flip", "repeat")))
        if action == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        elif action == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        else:
            data[at:at] = data[at:at + draw(st.integers(1, 16))]
    return bytes(data)


CLEAN = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{\"ok\": 1}"


async def fuzz(response: bytes, then_close: bool, cuts: tuple[int, ...]) -> None:
    def answer(request: bytes) -> list[Piece]:
        if request == b"clean":
            return [CLEAN]
        return [*split(response, cuts), *([CLOSE] if then_close else [])]
    backend = RawBackend(answer)
    await backend.start()
    client = Http1Client(backend.url, max_connections=1, timeouts=QUICK)
    try:
        try:
            async with asyncio.timeout(QUICK.total_s + 1.0):
                reply = await client.post("/x", b"fuzz")
                try:
                    await reply.read()
                finally:
                    reply.release()
        except aiohttp.ClientError:
            pass  # (a timeout is one: `ServerTimeoutError`)
        await backend.until_answered(1)
        await asyncio.sleep(0.005)
        reply = await client.post("/x", b"clean")  # the pool holds nothing of the fuzz
        assert (reply.status, await reply.read()) == (200, b'{"ok": 1}')
        reply.release()
    finally:
        await client.close()
        await backend.stop()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(response=mutated(), then_close=st.booleans(),
       cuts=st.lists(st.integers(1, 200), max_size=3).map(tuple))
def test_any_mutated_response_ends_in_an_answer_or_a_client_error(
        response: bytes, then_close: bool, cuts: tuple[int, ...]) -> None:
    asyncio.run(asyncio.wait_for(fuzz(response, then_close, cuts), 10.0))
