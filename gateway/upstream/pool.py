"""All backends' adapters, kept in step with the live policy and the supervisor.

A backend with `launch:` has no URL until the supervisor's child answers `/health`;
until then (and whenever the child is down) it is `unavailable` with a reason the
client sees in its 503.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gateway.core.deadline import Timeouts
from gateway.core.errors import BadRequest
from gateway.upstream.anthropic import AnthropicUpstream, unsupported_message
from gateway.upstream.openai import OpenAIUpstream
from policies.capabilities import ModelCapabilities
from policies.load import ModelTarget, Policy
from policies.schema import Backend

# Adapter per backend `type`; every one serves chat completions.
ADAPTERS: dict[str, type[OpenAIUpstream]] = {"openai": OpenAIUpstream,
                                             "anthropic": AnthropicUpstream}
# The endpoint paths (relative to /v1) a backend type can serve, where not all of them.
ENDPOINTS_BY_TYPE = {"anthropic": frozenset({"/chat/completions"})}


class UpstreamBody(Protocol):
    async def readany(self) -> bytes: ...


class UpstreamResponse(Protocol):
    """What the pipeline reads from an adapter: an aiohttp response, or an adapter's
    OpenAI-shaped view of another API's response."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content_type(self) -> str: ...
    @property
    def content(self) -> UpstreamBody: ...
    async def read(self, max_bytes: int | None = None) -> bytes: ...
    def release(self) -> Any: ...
    def close(self) -> None: ...


class Upstream(Protocol):
    """One backend's adapter, whatever API it speaks."""

    backend: Backend
    base_url: str
    on_resend: Callable[[str], None] | None

    def prepare(self, path: str, raw: bytes, body: dict[str, Any], *, model: str,
                stream_usage: bool, priority: str = "normal") -> bytes: ...
    def band_header(self, priority: str) -> str | None: ...
    async def open(self, path: str, body: bytes, headers: Mapping[str, str] | None = None,
                   timeouts: Timeouts | None = None) -> UpstreamResponse: ...
    async def close(self) -> None: ...
    def retire(self) -> None: ...
    @property
    def idle_closed(self) -> bool: ...
    @property
    def trust_rotated(self) -> bool: ...


class UpstreamPool:
    def __init__(self) -> None:
        self._adapters: dict[str, Upstream] = {}
        self._launched_urls: dict[str, str] = {}
        self._down_reasons: dict[str, str] = {}
        # Replaced by a reload or a child's restart: each closes its own session once
        # its last request is done; kept here only to be closed at shutdown.
        self._retired: list[Upstream] = []
        self._current: frozenset[str] | None = None  # the live policy's enabled backends
        self.on_capabilities: Callable[[str, ModelCapabilities | None], None] | None = None
        # a request sent again on a new connection (`Http1Client.on_resend`), by backend
        self.on_resend: Callable[[str], None] | None = None

    def follow(self, policy: Policy) -> None:
        """The live policy (at start and after each reload, changed or not): adapters of
        backends it no longer has, or has disabled, and those whose `ca_file` has been
        rotated on disk, are retired and close once their last request is done (the
        next request builds a new one)."""
        self._current = frozenset(name for name, backend in policy.file.backends.items()
                                  if backend.enabled)
        for name in [name for name, adapter in self._adapters.items()
                     if name not in self._current or adapter.trust_rotated]:
            self._retire(self._adapters.pop(name))

    def get(self, name: str, backend: Backend) -> Upstream | None:
        """The adapter for `backend` as the current policy describes it, or None."""
        adapter = self._adapters.get(name)
        if adapter is not None and (adapter.backend is backend or adapter.backend == backend):
            adapter.backend = backend  # identity check is the fast path next time
            return adapter
        kind = ADAPTERS.get(backend.type)
        if kind is None:
            self._down_reasons.setdefault(name, f"no adapter for backend type '{backend.type}'")
            return None
        # a fleet's first listed replica: the fleet's own calls pick per request
        url = backend.url or self._launched_urls.get(name) or next(iter(backend.urls), None)
        if url is None:
            return None
        if adapter is not None:
            self._retire(adapter)
        adapter = kind(name, backend, url)
        adapter.on_resend = self.on_resend
        if self._current is not None and name not in self._current:
            # a request still running under an older policy: served, then closed
            self._retire(adapter)
        else:
            self._adapters[name] = adapter
        return adapter

    @staticmethod
    def serving(path: str, candidates: Sequence[ModelTarget]) -> Sequence[ModelTarget]:
        """The candidates whose backend type has `path` (`/embeddings`); a 400 naming the
        backend when none has, so a route mixing types still falls back to one that can."""
        if path == "/chat/completions":  # every adapter serves it: the hot path, no scan
            return candidates
        able = [target for target in candidates
                if path in ENDPOINTS_BY_TYPE.get(target.backend.type, (path,))]
        if candidates and not able:
            raise BadRequest(unsupported_message(candidates[0].backend_name, path))
        return able

    def is_up(self, name: str, backend: Backend) -> bool:
        """Whether requests can be sent to `backend` now (a launched one once it answers)."""
        return backend.type in ADAPTERS and bool(backend.url or backend.urls
                                                 or name in self._launched_urls)

    def unavailable_reason(self, name: str) -> str:
        return self._down_reasons.get(name, f"backend '{name}' has no URL yet")

    def set_launched(self, name: str, url: str,
                     capabilities: ModelCapabilities | None = None) -> None:
        """The supervisor's child for `name` is healthy at `url`, and says it can do
        `capabilities` (told to `on_capabilities`, for routing)."""
        if self.on_capabilities is not None:
            self.on_capabilities(name, capabilities)
        self._launched_urls[name] = url
        self._down_reasons.pop(name, None)
        adapter = self._adapters.pop(name, None)
        if adapter is not None:
            self._retire(adapter)

    def set_down(self, name: str, reason: str) -> None:
        self._launched_urls.pop(name, None)
        self._down_reasons[name] = reason
        adapter = self._adapters.pop(name, None)
        if adapter is not None:
            self._retire(adapter)

    def _retire(self, adapter: Upstream) -> None:
        adapter.retire()
        self._retired = [old for old in self._retired if not old.idle_closed]
        self._retired.append(adapter)

    def status(self, policy: Policy) -> dict[str, str]:
        """`ready` or the reason it is not, per enabled backend."""
        report = {}
        for name, backend in policy.file.backends.items():
            if not backend.enabled:
                continue
            if backend.api_key is not None and not backend.api_key.get_secret_value():
                report[name] = "enabled with an empty api_key (its variable is not set?)"
            else:
                report[name] = ("ready" if self.is_up(name, backend)
                                else self.unavailable_reason(name))
        return report

    async def close(self) -> None:
        for adapter in [*self._adapters.values(), *self._retired]:
            await adapter.close()
        self._adapters.clear()
        self._retired.clear()
