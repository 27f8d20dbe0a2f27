"""Who may use `/admin/keys` and `/admin/spend`: a policy admin key (everything), or a
managed key with an admin scope (`admin:read`, `admin:write`), limited to its own
tenant's keys and spend. Failed attempts are audited and, past
`MAX_FAILURES_PER_MINUTE` from one address, refused before any key is looked at (429),
so the endpoints cannot be used to try keys at speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from gateway.core.auth import admin_key
from gateway.core.errors import Forbidden, GatewayError, RateLimited
from gateway.keys.audit import AuditLog
from gateway.keys.view import KeyView
from gateway.limits.headers import retry_headers
from policies.load import Policy

MAX_FAILURES_PER_MINUTE = 10
_TRACKED_ADDRESSES = 10_000  # bounded: past it the oldest minute's counts are forgotten


@dataclass(frozen=True, slots=True)
class Admin:
    who: str  # "admin_key:<hash prefix>" or "key:<id>", for the audit log
    tenant: str | None  # None: every tenant (a policy admin key)
    write: bool


class TooManyFailures(RateLimited):
    code = "too_many_failed_authentications"


class ScopeMissing(Forbidden):
    """An admin key of the right kind, short of the scope the action needs."""


class FailedAuthGuard:
    """Failed admin authentications per client address, per minute."""

    def __init__(self) -> None:
        self._minute = 0
        self._failures: dict[str, int] = {}

    def _current(self) -> dict[str, int]:
        minute = int(time.monotonic() // 60)
        if minute != self._minute or len(self._failures) > _TRACKED_ADDRESSES:
            self._minute, self._failures = minute, {}
        return self._failures

    def blocked(self, remote: str) -> bool:
        return self._current().get(remote, 0) >= MAX_FAILURES_PER_MINUTE

    def failed(self, remote: str) -> None:
        failures = self._current()
        failures[remote] = failures.get(remote, 0) + 1


def authorize(request: web.Request, policy: Policy, view: KeyView, guard: FailedAuthGuard,
              audit: AuditLog, *, write: bool) -> Admin:
    remote = request.remote or "?"
    action = f"{request.method} {request.path}"
    if guard.blocked(remote):
        audit.write(who="?", action="auth", outcome="throttled", remote=remote, detail=action)
        raise TooManyFailures("Too many failed admin authentications from this address; "
                              "retry in a minute.", headers=retry_headers(60.0))
    try:
        return _admin(request, policy, view, write=write)
    except GatewayError as exc:
        # a wrong key counts; a right key short of a scope, or a store out (503), does not
        if exc.status in (401, 403) and not isinstance(exc, ScopeMissing):
            guard.failed(remote)
        audit.write(who="?", action="auth", outcome=f"refused_{exc.status}", remote=remote,
                    detail=action)
        raise


def _admin(request: web.Request, policy: Policy, view: KeyView, *, write: bool) -> Admin:
    digest, matched = admin_key(request, policy)  # a managed key may have an admin scope
    if matched:
        return Admin(f"admin_key:{digest.removeprefix('sha256:')[:12]}", None, True)
    identity = view.identity(digest)
    managed = view.entry(digest) if identity is not None else None
    if managed is None or not managed.record.scopes:
        raise Forbidden("This key is not an admin key.")
    scopes = managed.record.scopes
    if write and "admin:write" not in scopes:
        raise ScopeMissing("This key's scope is admin:read; this action needs admin:write.")
    return Admin(f"key:{managed.record.id}", managed.record.tenant, "admin:write" in scopes)
