"""Each scenario: a name and what it does against the gateway, returning one outcome
per request sent (see `clients`). Upstream faults go through the fault's route, alone
(the client must get a clear error) or with a healthy fallback (most become ok)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import orjson

from tests.chaos import clients
from tests.chaos.client_edges import CLIENT_EDGE_SCENARIOS
from tests.chaos.suite import Chaos, Scenario


def upstream_fault(fault: str, stream: bool, *, fallback: bool = False) -> Scenario:
    async def run(chaos: Chaos, n: int) -> list[str]:
        model = f"{fault}+fallback" if fallback else fault
        return await chaos.requests(n, model, stream)
    return run


def _chat(data: bytes) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: chaos\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
            % (len(data), data))


async def disconnect_mid_stream(chaos: Chaos, n: int) -> list[str]:
    """Clients hang up after the first bytes of a slow stream; the gateway must drop
    the backend's stream too and keep serving (judged by a request after each)."""
    async def one() -> str:
        await clients.disconnect_mid_stream(chaos.session, chaos.gateway.url, "slow_stream")
        return await clients.request(chaos.session, chaos.gateway.url, "healthy", True)
    return await chaos.many(n, one)


async def never_read(chaos: Chaos, n: int) -> list[str]:
    """Clients ask for a 4 MB stream and never read it: the gateway must not buffer it."""
    port = chaos.gateway.port
    await asyncio.gather(*(clients.never_read(port, "big_stream", 1.5)
                           for _ in range(min(n, 20))))
    return await chaos.requests(n, "healthy", True)


async def slow_read(chaos: Chaos, n: int) -> list[str]:
    return await chaos.requests(n, "slow_stream", True, read_pause_s=0.01)


async def slow_headers(chaos: Chaos, n: int) -> list[str]:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: chaos\r\nX-Slow: one byte at a time"
    return await chaos.many(n, lambda: clients.raw_exchange(chaos.gateway.port, head,
                                                            trickle_s=0.1))


async def stalled_body(chaos: Chaos, n: int) -> list[str]:
    data = clients.body("healthy", False)
    start = _chat(data)[:-len(data) + 10]  # the head and ten bytes of the body
    return await chaos.many(n, lambda: clients.raw_exchange(chaos.gateway.port, start))


async def oversized_body(chaos: Chaos, n: int) -> list[str]:
    big = orjson.dumps({"model": "healthy", "messages": [
        {"role": "user", "content": "x" * (5 << 20)}]})
    return await chaos.many(min(n, 10), lambda: clients.raw_exchange(chaos.gateway.port,
                                                                     _chat(big)))


async def many_connections(chaos: Chaos, n: int) -> list[str]:
    """More idle connections from one address than the gateway allows one client
    (400): the extra ones are refused at once; the rest still serve a request each."""
    count = 500 if n >= 50 else 450
    port = chaos.gateway.port
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]
    await asyncio.sleep(0.2)
    data = clients.body("healthy", False)

    async def use(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        with contextlib.suppress(ConnectionError):
            writer.write(_chat(data))
        try:
            async with asyncio.timeout(clients.DEADLINE_S):
                return await clients.read_answer(reader)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError) as exc:
            return f"{clients.LOST}: {type(exc).__name__}"
        finally:
            writer.close()

    return list(await asyncio.gather(*(use(r, w) for r, w in opened)))


async def redis_restart(chaos: Chaos, n: int) -> list[str]:
    """Redis (the limit store) killed and started again while requests run."""
    redis = chaos.redis
    if redis is None:
        return []
    load = asyncio.ensure_future(chaos.requests(n * 4, "healthy", False))
    await asyncio.sleep(0.1)
    redis.kill()
    await asyncio.sleep(0.5)
    redis.start()
    return await load


async def broken_policy_reload(chaos: Chaos, n: int) -> list[str]:
    """A broken policy file written under a running gateway, then the good one back."""
    path = chaos.gateway.policy_path
    good = path.read_text()
    load = asyncio.ensure_future(chaos.requests(n * 4, "stall+fallback", True))
    for broken in ("version: 1\nbackends: {", "version: 1\nbackends: {}\n",
                   good.replace("openai", "nonsense", 1)):
        path.write_text(broken)
        await asyncio.sleep(0.3)
    path.write_text(good)
    return await load


async def local_backend_killed(chaos: Chaos, n: int) -> list[str]:
    """The launched local backend SIGKILLed while it streams: streams under way end
    with an error event, new requests fall back while the supervisor restarts it."""
    if not chaos.gateway.children():
        return []  # the short form launches none
    for _ in range(600):  # its first start loads torch and the model
        if await clients.request(chaos.session, chaos.gateway.url, "local", False) \
                == clients.OK:
            break
        await asyncio.sleep(0.5)
    streams = asyncio.ensure_future(chaos.requests(n, "local+fallback", True))
    await asyncio.sleep(1.0)
    for pid in chaos.gateway.children():
        os.kill(pid, signal.SIGKILL)
    meanwhile = await chaos.requests(n, "local+fallback", True)
    return [*await streams, *meanwhile]


SCENARIOS: dict[str, Scenario] = {
    "healthy (stream)": upstream_fault("healthy", True),
    "healthy (json)": upstream_fault("healthy", False),
    "reset before headers": upstream_fault("reset_before_headers", False),
    "reset before headers +fallback": upstream_fault("reset_before_headers", True,
                                                     fallback=True),
    "reset after headers": upstream_fault("reset_after_headers", True),
    "reset mid-stream": upstream_fault("reset_mid_stream", True),
    "stall": upstream_fault("stall", False),
    "stall +fallback": upstream_fault("stall", True, fallback=True),
    "slow first byte": upstream_fault("slow_first_byte", True),
    "clean EOF mid-stream": upstream_fault("eof_mid_stream", True),
    "JSON for a stream +fallback": upstream_fault("json_for_stream", True, fallback=True),
    "JSON for a stream": upstream_fault("json_for_stream", True),
    "malformed events": upstream_fault("malformed_events", True),
    "oversized reply": upstream_fault("oversized", False),
    "oversized event": upstream_fault("oversized", True),
    "endless stream": upstream_fault("endless", True),
    "429": upstream_fault("status_429", False),
    "429 Retry-After +fallback": upstream_fault("status_429_retry_after", False,
                                                fallback=True),
    "500": upstream_fault("status_500", True),
    "503 Retry-After": upstream_fault("status_503_retry_after", False),
    "503 +fallback": upstream_fault("status_503", True, fallback=True),
    "529": upstream_fault("status_529", False),
    "client disconnects mid-stream": disconnect_mid_stream,
    "client never reads": never_read,
    "client reads slowly": slow_read,
    "client sends headers slowly": slow_headers,
    "client stalls its body": stalled_body,
    "client sends 5 MB": oversized_body,
    "too many connections": many_connections,
    "redis killed and restarted": redis_restart,
    "broken policies hot-loaded": broken_policy_reload,
    "local backend killed mid-stream": local_backend_killed,
}


# -- framing faults: the gateway hides them (ok) or ends the stream with an error --------

def hidden(scenario: Scenario) -> Scenario:
    """A fault a healthy path exists around: anything but ok counts as lost."""
    async def run(chaos: Chaos, n: int) -> list[str]:
        return [outcome if outcome == clients.OK else f"{clients.LOST}: {outcome}, not ok"
                for outcome in await scenario(chaos, n)]
    return run


async def reset_on_reuse(chaos: Chaos, n: int) -> list[str]:
    """Rounds of requests back to back: each goes out on a kept-alive connection the
    backend ends, unread, just after its last answer; the gateway must send it again
    (and count it: a round that reused nothing proves nothing)."""
    outcomes = [outcome for _ in range(3)
                for outcome in await chaos.requests(n, "reset_on_reuse", False)]
    async with chaos.session.get(f"http://127.0.0.1:{chaos.gateway.port}/metrics") as reply:
        metrics = await reply.text()
    if 'routegate_upstream_resends_total{backend="reset_on_reuse"}' not in metrics:
        outcomes.append(f"{clients.LOST}: no request was resent")
    return outcomes


FRAMING_SCENARIOS: dict[str, Scenario] = {
    "1xx before the answer": hidden(upstream_fault("interim_1xx", True)),
    "1xx before the answer (json)": hidden(upstream_fault("interim_1xx", False)),
    "Brotli reply": hidden(upstream_fault("brotli", False)),
    "Brotli stream": hidden(upstream_fault("brotli", True)),
    "undecodable Brotli +fallback": hidden(upstream_fault("bad_brotli", False,
                                                          fallback=True)),
    "bad chunk size mid-stream": upstream_fault("bad_chunk", True),
    "bad chunk size +fallback": hidden(upstream_fault("bad_chunk", False, fallback=True)),
    "trickled headers +fallback": hidden(upstream_fault("trickled_headers", True,
                                                        fallback=True)),
    "bare-CR event stream": hidden(upstream_fault("bare_cr", True)),
    "reset on reuse": hidden(reset_on_reuse),
}
SCENARIOS.update(FRAMING_SCENARIOS)

# -- the client side's scenarios (tests/chaos/client_edges.py) --------------------------
SCENARIOS.update(CLIENT_EDGE_SCENARIOS)

# Slow Redis (`limits.store_latency`): the gateway reaches Redis through a delaying proxy
# (`tests/delay_proxy.py`), near but for this scenario.
SLOW_REDIS_DELAY_S = 0.2  # each way: 400 ms a round trip, under the 1 s call timeout


async def redis_far_away(chaos: Chaos, n: int) -> list[str]:
    """Redis 200 ms away each way while requests run: the limit store must go out for
    slowness (fail_open: requests decided locally, none waiting on it), and be taken
    back once Redis is near again. Each of those not seen is a lost outcome."""
    proxy = chaos.redis_proxy
    if proxy is None:
        return []
    proxy.delay_s = SLOW_REDIS_DELAY_S
    try:
        outcomes = await chaos.requests(n * 4, "healthy", False)
        out_for_slowness = await _store_metric_reaches(
            chaos, 'routegate_limit_store_out{reason="slow"} 1.0', 5.0)
    finally:
        proxy.delay_s = 0.0
    back = await _store_metric_reaches(chaos, "routegate_limit_store_up 1.0", 15.0)
    if not out_for_slowness:
        outcomes.append(f"{clients.LOST}: the store was never out for slowness")
    if not back:
        outcomes.append(f"{clients.LOST}: the store was not taken back")
    return outcomes


async def _store_metric_reaches(chaos: Chaos, line: str, timeout_s: float) -> bool:
    metrics = f"http://127.0.0.1:{chaos.gateway.port}/metrics"
    for _ in range(int(timeout_s / 0.1)):
        async with chaos.session.get(metrics) as reply:
            if line in (await reply.text()).splitlines():
                return True
        await asyncio.sleep(0.1)
    return False


SCENARIOS["redis 200 ms away"] = redis_far_away
