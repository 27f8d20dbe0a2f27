"""All backends' adapters, kept in step with the live policy and the supervisor.

A backend with `launch:` has no URL until the supervisor's child answers `/health`;
until then (and whenever the child is down) it is `unavailable` with a reason the
client sees in its 503.
"""

from __future__ import annotations

from gateway.upstream.openai import OpenAIUpstream
from policies.load import Policy
from policies.schema import Backend


class UpstreamPool:
    def __init__(self) -> None:
        self._adapters: dict[str, OpenAIUpstream] = {}
        self._launched_urls: dict[str, str] = {}
        self._down_reasons: dict[str, str] = {}
        self._retired: list[OpenAIUpstream] = []  # replaced by a reload; closed at shutdown

    def get(self, name: str, backend: Backend) -> OpenAIUpstream | None:
        """The adapter for `backend` as the current policy describes it, or None."""
        adapter = self._adapters.get(name)
        if adapter is not None and (adapter.backend is backend or adapter.backend == backend):
            adapter.backend = backend  # identity check is the fast path next time
            return adapter
        if backend.type != "openai":
            self._down_reasons.setdefault(name, f"no adapter for backend type '{backend.type}'")
            return None
        url = backend.url or self._launched_urls.get(name)
        if url is None:
            return None
        if adapter is not None:
            self._retired.append(adapter)
        adapter = self._adapters[name] = OpenAIUpstream(name, backend, url)
        return adapter

    def unavailable_reason(self, name: str) -> str:
        return self._down_reasons.get(name, f"backend '{name}' has no URL yet")

    def set_launched(self, name: str, url: str) -> None:
        """The supervisor's child for `name` is healthy at `url`."""
        self._launched_urls[name] = url
        self._down_reasons.pop(name, None)
        adapter = self._adapters.pop(name, None)
        if adapter is not None:
            self._retired.append(adapter)

    def set_down(self, name: str, reason: str) -> None:
        self._launched_urls.pop(name, None)
        self._down_reasons[name] = reason
        adapter = self._adapters.pop(name, None)
        if adapter is not None:
            self._retired.append(adapter)

    def status(self, policy: Policy) -> dict[str, str]:
        """`ready` or the reason it is not, per enabled backend."""
        report = {}
        for name, backend in policy.file.backends.items():
            if not backend.enabled:
                continue
            ready = backend.type == "openai" and (backend.url or name in self._launched_urls)
            report[name] = "ready" if ready else self.unavailable_reason(name)
        return report

    async def close(self) -> None:
        for adapter in [*self._adapters.values(), *self._retired]:
            await adapter.close()
        self._adapters.clear()
        self._retired.clear()
