"""A dedicated backend's replicas, and the pick of one per request.

    launch: {replicas: N}   N local_backend children (the supervisor's `name#i`)
    urls: [...]             listed replicas
    url + resolve: all      every address of the URL's host name (re-resolved)

One target (`backend/model`) names the whole fleet in routes; the limits, ledger and
compliance see one backend. Per replica the gateway keeps: requests it has
outstanding there, the queue, running count and KV use the replica reports on its
`/metrics` (`replica_watch.py`), its own health in the one health model (outlier
ejection by failures in a row, its active checks; `routing.outliers.Ejections` keyed
by replica), and cached-token counts. `pick:` chooses among those in service
(`routing.replica_pick`), with the prompt's prefix blocks looked up in a bounded
index per backend (`routing.prefix_index`).

Every request to a dedicated backend carries the tenant's cache salt (`cache_salt`, a
keyed hash of the tenant name) unless its route or tenant says `prefix_cache: shared`;
the same salt seeds the index's hashes, so tenant B's prompt is never predicted to be
in cache because tenant A sent it.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from time import monotonic
from typing import Any
from urllib.parse import urlsplit

from gateway.core.context import RequestContext
from gateway.telemetry.prompt_tokens import PromptTokens
from gateway.upstream.openai import OpenAIUpstream
from policies.load import Policy
from policies.schema import Backend
from routing.decide import max_ejected
from routing.outliers import Ejections
from routing.prefix_index import PrefixIndex, block_hashes, prompt_text
from routing.replica_pick import Pick, ReplicaView, in_service, pick
from routing.stats import LOAD_FRESH_S, LiveStats

log = logging.getLogger("routegate.replicas")

DEFAULT_SALT_KEY = b"routegate cache salt"  # `fleet.salt_key` unset: salts are still apart


def replica_name(url: str) -> str:
    """A replica's name in reports and the `replica` label: its host:port."""
    return urlsplit(url).netloc


@dataclass(slots=True)
class Replica:
    name: str
    url: str  # its API base, `http://host:port/v1`
    source: str  # launch | urls | dns
    adapter: OpenAIUpstream
    outstanding: int = 0
    waiting: int | None = None
    running: int | None = None
    kv_use: float | None = None
    load_at: float | None = None
    # with `precise`: which life of the replica's prefix-event log was read, and how far
    events_epoch: str | None = None
    events_next: int = 0

    def view(self, now: float, ejected_until: float | None) -> ReplicaView:
        fresh = self.load_at is not None and now - self.load_at <= LOAD_FRESH_S
        return ReplicaView(self.name, self.outstanding,
                           self.waiting if fresh else None, self.running if fresh else None,
                           self.kv_use if fresh else None, ejected_until)


@dataclass(slots=True)
class Fleet:
    """One backend's replicas, their health and its prefix index."""

    name: str
    backend: Backend
    replicas: dict[str, Replica] = field(default_factory=dict)
    health: LiveStats = field(default_factory=LiveStats)
    turn: int = 0
    index: PrefixIndex = field(init=False)
    ejections: Ejections = field(init=False)
    precise: bool = field(init=False)  # the index follows the replicas' prefix events
    block_chars_header: str = field(init=False)

    def __post_init__(self) -> None:
        prefix = self.backend.fleet.prefix
        self.index = PrefixIndex(prefix.index_blocks)
        self.ejections = Ejections(self.health)
        self.precise = prefix.precise and self.backend.pick == "prefix"
        self.block_chars_header = str(prefix.block_chars)

    def set_urls(self, urls: Mapping[str, str], source: str) -> None:
        """The replicas from `source` are now exactly `urls` (name → API base URL)."""
        for name in [n for n, r in self.replicas.items() if r.source == source
                     and n not in urls]:
            self.remove(name)
        for name, url in urls.items():
            if name not in self.replicas:
                self.add(name, url, source)

    def add(self, name: str, url: str, source: str) -> None:
        old = self.replicas.get(name)
        if old is not None and old.url == url:
            return
        if old is not None:
            self.remove(name)
        self.replicas[name] = Replica(name, url, source, OpenAIUpstream(self.name, self.backend,
                                                                        url))
        log.info("backend %s: replica %s joined (%s)", self.name, name, source)

    def remove(self, name: str) -> None:
        replica = self.replicas.pop(name, None)
        if replica is None:
            return
        replica.adapter.retire()  # closes once its last request is done
        self.index.forget(name)
        self.ejections.forget(name)
        log.info("backend %s: replica %s left", self.name, name)

    def views(self, now: float) -> list[ReplicaView]:
        ejected = self.health.snapshot().ejected
        down = self.health.snapshot().targets
        return [replica.view(now, ejected.get(name)) for name, replica in self.replicas.items()
                if down.get(name) is None or down[name].healthy(now)]

    def choose(self, hashes: list[int], percent: float) -> Pick | None:
        now = monotonic()
        views = self.views(now)
        serving = in_service(views, now, max_ejected(len(views), percent))
        self.turn += 1
        return pick(self.backend.pick, serving, held=self.index.matched(hashes),
                    blocks=len(hashes), weights=self.backend.fleet.prefix, turn=self.turn,
                    cache_blocks=self.index.held)

    def report(self, now: float,
               counts: Mapping[tuple[str, str], Sequence[int]]) -> dict[str, dict[str, Any]]:
        """Each replica's state and load; `counts`: answered requests, prompt and cached
        tokens per (backend, replica), as telemetry counts them."""
        states = self.ejections.report(now)
        out = {}
        for name, replica in sorted(self.replicas.items()):
            state = states.get(name, {"state": "in_service"})
            view = replica.view(now, None)
            requests, prompt_tokens, cached_tokens = counts.get((self.name, name), (0, 0, 0))
            out[name] = {
                "url": replica.url, "source": replica.source, "state": state["state"],
                "consecutive_failures": state.get("consecutive_failures", 0),
                "ejections_total": state.get("ejections_total", 0),
                "outstanding": replica.outstanding, "waiting": view.waiting,
                "running": view.running, "kv_cache_use": view.kv_use,
                "requests": requests, "prompt_tokens": prompt_tokens,
                "cached_tokens": cached_tokens,
                "cache_hit_rate": round(cached_tokens / prompt_tokens, 4)
                if prompt_tokens else None,
                "index_blocks": self.index.held.get(name, 0),  # what the index says it holds
            }
        return out


def cache_salt(key: bytes, tenant: str) -> str:
    """The tenant's salt: a keyed hash of its name, so a salt names no tenant."""
    return hmac.new(key, tenant.encode(), sha256).hexdigest()[:32]


def salt_for(ctx: RequestContext, backend: Backend) -> str | None:
    """The cache salt of this request on `backend`; None where the route or the tenant
    shares the cache (`prefix_cache: shared`)."""
    policy = ctx.policy
    tenant = ctx.identity.tenant
    route = policy.file.routes.get(ctx.record.route or ctx.record.requested_model)
    setting = route.prefix_cache if route is not None else None
    if setting is None:
        spec = policy.file.tenants.get(tenant)
        setting = spec.prefix_cache if spec is not None else "tenant"
    if setting == "shared":
        return None
    secret = backend.fleet.salt_key
    key = secret.get_secret_value().encode() if secret is not None else DEFAULT_SALT_KEY
    return cache_salt(key, tenant)


class Fleets:
    """Every fleet backend of the live policy, by name (`follow` on each reload)."""

    def __init__(self, resolver: Callable[..., Any] | None = None) -> None:
        self.fleets: dict[str, Fleet] = {}
        self.resolver = resolver  # injected for tests: (host, port) → addresses
        self._launched: dict[str, dict[int, str]] = {}
        # telemetry's prompt and cached tokens per (backend, replica), for `report`
        self.tokens: PromptTokens | None = None

    def follow(self, policy: Policy) -> None:
        wanted = {name: backend for name, backend in policy.file.backends.items()
                  if backend.enabled and backend.is_fleet}
        for name in [n for n in self.fleets if n not in wanted]:
            for replica in list(self.fleets[name].replicas):
                self.fleets[name].remove(replica)
            del self.fleets[name]
        for name, backend in wanted.items():
            fleet = self.fleets.get(name)
            if fleet is None or fleet.backend != backend:
                old = fleet
                fleet = self.fleets[name] = Fleet(name, backend)
                if old is not None:  # settings changed: the replicas' adapters too
                    for replica in list(old.replicas):
                        old.remove(replica)
            if backend.urls:
                fleet.set_urls({replica_name(url): url.rstrip("/") for url in backend.urls},
                               "urls")
            launched = self._launched.get(name, {})
            fleet.set_urls({replica_name(url): url for url in launched.values()}, "launch")

    def launched(self, backend: str, index: int, url: str | None) -> None:
        """The supervisor's child `index` of `backend` serves at `url` (None: down)."""
        children = self._launched.setdefault(backend, {})
        if url is None:
            children.pop(index, None)
        else:
            children[index] = url
        fleet = self.fleets.get(backend)
        if fleet is not None:
            fleet.set_urls({replica_name(u): u for u in children.values()}, "launch")

    def get(self, name: str) -> Fleet | None:
        return self.fleets.get(name)

    def report(self, now: float) -> dict[str, dict[str, Any]]:
        return {name: {"pick": fleet.backend.pick, "precise": fleet.precise,
                       "index_blocks": len(fleet.index),
                       "replicas": fleet.report(now, self.tokens.counts if self.tokens
                                                 is not None else {})}
                for name, fleet in sorted(self.fleets.items())}


def request_text(ctx: RequestContext) -> str:
    body = ctx.body
    messages = body.get("messages") if isinstance(body, dict) else None
    if isinstance(messages, list):
        return prompt_text(messages)
    prompt = body.get("prompt") if isinstance(body, dict) else None
    return prompt if isinstance(prompt, str) else ""


def request_hashes(ctx: RequestContext, fleet: Fleet, salt: str | None) -> list[int]:
    return block_hashes(request_text(ctx), fleet.backend.fleet.prefix.block_chars, salt)


def cached_share(ctx: RequestContext, fleets: Fleets) -> dict[str, float] | None:
    """Per fleet target: the share of this prompt the replica holding most of it (in
    service) likely has in its prefix cache, for the TTFT prediction; None: no fleet."""
    if not fleets.fleets:
        return None
    text = request_text(ctx)
    out: dict[str, float] = {}
    now = monotonic()
    for name, fleet in fleets.fleets.items():
        block_chars = fleet.backend.fleet.prefix.block_chars
        if len(text) < block_chars:
            continue
        hashes = block_hashes(text, block_chars, salt_for(ctx, fleet.backend))
        held = fleet.index.matched(hashes)
        if not held:
            continue
        views = fleet.views(now)
        percent = ctx.policy.file.resilience.outlier_detection.max_ejection_percent
        serving = in_service(views, now, max_ejected(len(views), percent))
        best = max((held.get(view.name, 0) for view in serving), default=0)
        for model in fleet.backend.models:
            out[f"{name}/{model}"] = min(1.0, best * block_chars / len(text))
    return out
