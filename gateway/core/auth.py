"""API key → tenant.

A key arrives as `Authorization: Bearer KEY` (OpenAI SDKs) or `x-api-key: KEY`
(Anthropic SDKs). The policy lists only `sha256:<hex>` hashes, so the gateway never
holds a plain key; it hashes what it receives and looks the hash up. The final
comparison uses `hmac.compare_digest`, and because it runs on digests, how long a
lookup takes says nothing about how close a guessed key came. Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from gateway.core.errors import BadRequest, Forbidden, Unauthorized
from policies.load import Policy

TENANT_HEADER = "x-routegate-tenant"  # on every answer to an authenticated caller


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    key_hash: str | None  # None for anonymous access
    anonymous: bool = False
    # served anonymously although it presented a key the policy does not know (a typo,
    # a revoked key): the access log says so, `reject_unknown_keys` makes it a 401
    unknown_key: bool = False

    @property
    def auth(self) -> str:
        """How the caller was identified, for the access log."""
        return "unknown_key" if self.unknown_key else "anonymous" if self.anonymous else "key"


# A request's identity until authentication, its first step, replaces it: no tenant.
UNAUTHENTICATED = Identity(tenant="", key_hash=None)


def key_hash(key: str) -> str:
    # a header's bytes that are not UTF-8 came decoded with surrogateescape: hash the bytes
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def presented_key(request: web.Request) -> str | None:
    """The key the request presents; a 400 when it names one twice (which of two keys
    is the caller's is not the gateway's guess to make)."""
    headers = request.headers
    header = _only(headers.getall("Authorization", None), "Authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return _only(headers.getall("x-api-key", None), "x-api-key") or None


def _only(values: list[str] | None, name: str) -> str | None:
    if values is None:
        return None
    if len(values) > 1:
        raise BadRequest(f"The request has {len(values)} {name} headers; send one.",
                         code="duplicate_header")
    return values[0]


def is_loopback(peer: str | None) -> bool:
    if not peer:
        return False  # a Unix socket or unknown peer is not provably local
    try:
        return ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False


class KeyIndex:
    """Tenant key hashes bucketed by a short prefix of the digest, with the `Identity`
    each one stands for (immutable, so one per key serves all its requests).

    The bucket is found by a dict lookup on 16 bits of the digest (which tells an
    attacker nothing about the key itself); inside it every stored hash is compared
    with `hmac.compare_digest`, so a hit and a near miss take the same time.
    """

    __slots__ = ("_buckets", "anonymous", "anonymous_unknown_key", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._buckets: dict[str, list[tuple[str, Identity]]] = {}
        for digest, tenant in policy.tenant_by_key_hash.items():
            self._buckets.setdefault(digest[:11], []).append(
                (digest, Identity(tenant=tenant, key_hash=digest)))
        tenant = policy.file.auth.anonymous.tenant
        self.anonymous = Identity(tenant=tenant, key_hash=None, anonymous=True)
        self.anonymous_unknown_key = Identity(tenant=tenant, key_hash=None, anonymous=True,
                                              unknown_key=True)

    def identity(self, digest: str) -> Identity | None:
        found = None
        for stored, identity in self._buckets.get(digest[:11], ()):
            if hmac.compare_digest(stored, digest):
                found = identity
        return found


class ManagedKeys(Protocol):
    """Keys issued outside the policy file (`gateway/keys`): an O(1) in-memory lookup."""

    def identity(self, digest: str) -> Identity | None: ...


class Authenticator:
    """Resolves callers against the live policy, re-indexing keys when it changes; a key
    the policy does not list is looked up in `managed` (if wired)."""

    __slots__ = ("_index", "managed")

    def __init__(self, managed: ManagedKeys | None = None) -> None:
        self._index: KeyIndex | None = None
        self.managed = managed

    def index(self, policy: Policy) -> KeyIndex:
        index = self._index
        if index is None or index.policy is not policy:
            index = self._index = KeyIndex(policy)
        return index

    def authenticate(self, request: web.Request, policy: Policy) -> Identity:
        """The caller's tenant, or `Unauthorized`.

        With anonymous access on (and, if `loopback_only`, a loopback peer), a missing
        or unknown key is served as the anonymous tenant: such a caller could drop the
        key and get the same access, so accepting it grants nothing more, and SDKs that
        insist on some key work against a development gateway unchanged. An unknown key
        is marked as such (`Identity.unknown_key`), or refused with
        `anonymous.reject_unknown_keys`.
        """
        index = self.index(policy)
        key = presented_key(request)
        if key is not None:
            digest = key_hash(key)
            identity = index.identity(digest)
            if identity is None and self.managed is not None:
                identity = self.managed.identity(digest)
            if identity is not None:
                return identity
        # a key that is not one (`Authorization: KEY`, `Basic …`) was presented too
        presented = key is not None or "Authorization" in request.headers
        anonymous = policy.file.auth.anonymous
        if (anonymous.enabled and (not anonymous.loopback_only or is_loopback(request.remote))
                and not (presented and anonymous.reject_unknown_keys)):
            return index.anonymous_unknown_key if presented else index.anonymous
        if key is None and presented:
            raise Unauthorized(
                "The Authorization header does not use the Bearer scheme. Send the key as "
                "`Authorization: Bearer KEY` (or `x-api-key: KEY`).",
                code="invalid_authorization_header")
        if key is None:
            raise Unauthorized(
                "You didn't provide an API key. Send it as `Authorization: Bearer KEY`.",
                code="missing_api_key")
        raise Unauthorized("Incorrect API key provided.")


def admin_key(request: web.Request, policy: Policy) -> tuple[str, bool]:
    """(the presented key's hash, whether it is one of the policy's admin keys); 401 when
    no key was presented."""
    key = presented_key(request)
    if key is None:
        raise Unauthorized("Admin endpoints need an admin key: `Authorization: Bearer KEY`.",
                           code="missing_api_key")
    digest = key_hash(key)
    matched = False
    for stored in policy.admin_key_hashes:  # a handful at most; compare all, constant time
        matched |= hmac.compare_digest(stored, digest)
    return digest, matched


def require_admin(request: web.Request, policy: Policy) -> str:
    """For `/admin/...` handlers: the admin key's hash, or 401 (no key) / 403 (not admin)."""
    digest, matched = admin_key(request, policy)
    if not matched:
        raise Forbidden("This key is not an admin key.")
    return digest
