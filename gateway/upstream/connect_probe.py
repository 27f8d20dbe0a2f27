"""Can a URL backend be reached at all? A TCP connect, for `/readyz`.

A backend whose address refuses or drops connections must not count as ready: an
orchestrator would send traffic to a gateway that can only answer 502. The probe is
a connect, nothing more (no request, no key sent), made when `/readyz` asks and
remembered for a couple of seconds so frequent probes do not open a connection per
call. It is the one seam readiness reads reachability through: a health checker
that knows more can stand in its place (`unreachable(policy)`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web

from policies.load import Policy


class ConnectProbe:
    def __init__(self, *, timeout_s: float = 1.0, remember_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.remember_s = remember_s
        self._clock = clock
        self._seen: dict[tuple[str, int], tuple[float, str | None]] = {}  # → (at, failure)

    async def unreachable(self, policy: Policy) -> dict[str, str]:
        """Enabled backends with a `url` that cannot be connected to, and why."""
        addresses: dict[str, tuple[str, int]] = {}
        for name, backend in policy.file.backends.items():
            if backend.enabled and backend.url:
                parts = urlsplit(backend.url)
                port = parts.port or (443 if parts.scheme == "https" else 80)
                addresses[name] = (parts.hostname or "", port)
        unique = list(dict.fromkeys(addresses.values()))
        failed = dict(zip(unique, await asyncio.gather(*map(self._failure, unique)),
                          strict=True))
        # entries for addresses no longer in the policy go: the memory stays bounded
        self._seen = {address: self._seen[address] for address in failed
                      if address in self._seen}
        return {name: failure for name, address in addresses.items()
                if (failure := failed[address]) is not None}

    async def _failure(self, address: tuple[str, int]) -> str | None:
        now = self._clock()
        seen = self._seen.get(address)
        if seen is not None and now - seen[0] < self.remember_s:
            return seen[1]
        host, port = address
        failure: str | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                _, writer = await asyncio.open_connection(host, port)
            writer.close()
        except TimeoutError:
            failure = f"cannot connect to {host}:{port} (no answer within {self.timeout_s:g}s)"
        except OSError as exc:
            failure = f"cannot connect to {host}:{port} ({exc.strerror or type(exc).__name__})"
        self._seen[address] = (now, failure)
        return failure


READINESS = web.AppKey("routegate.readiness", ConnectProbe)
