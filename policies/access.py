"""Who may ask for what: each tenant's (and key's) `allow` / `allow_targets` globs,
expanded once against the policy's route and target names into plain sets.

A name a caller may not use is, to that caller, a name that does not exist (404
`model_not_found`, as OpenAI answers for a model an organisation cannot see).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from policies.schema import PolicyFile


@dataclass(frozen=True, slots=True)
class Access:
    routes: frozenset[str]  # route names it may ask for
    targets: frozenset[str]  # `backend/model` names it may ask for directly
    # the globs themselves, for names not served now (a disabled backend's)
    allow: tuple[str, ...] = ()
    allow_targets: tuple[str, ...] = ()

    def allows(self, name: str) -> bool:
        return name in self.routes or name in self.targets

    def would_allow(self, name: str, *, target: bool) -> bool:
        """Whether the globs admit `name`, served now or not."""
        return bool(_matching((name,), self.allow_targets if target else self.allow))


def _matching(names: Iterable[str], globs: Sequence[str]) -> frozenset[str]:
    return frozenset(name for name in names if any(fnmatchcase(name, g) for g in globs))


class AccessTable:
    """Access by (tenant, key hash), built when the policy loads."""

    __slots__ = ("_by_key", "_by_tenant", "_default")

    def __init__(self, policy: PolicyFile, routes: Iterable[str],
                 targets: Iterable[str]) -> None:
        routes, targets = tuple(routes), tuple(targets)
        defaults = policy.defaults

        def access(allow: Sequence[str], allow_targets: Sequence[str]) -> Access:
            return Access(_matching(routes, allow), _matching(targets, allow_targets),
                          tuple(allow), tuple(allow_targets))

        self._default = access(defaults.allow, defaults.allow_targets)
        self._by_tenant: dict[str, Access] = {}
        self._by_key: dict[str, Access] = {}
        for name, tenant in policy.tenants.items():
            allow = defaults.allow if tenant.allow is None else tenant.allow
            allow_targets = (defaults.allow_targets if tenant.allow_targets is None
                             else tenant.allow_targets)
            self._by_tenant[name] = access(allow, allow_targets)
            for key_hash, key in tenant.key_access.items():
                self._by_key[key_hash] = access(
                    allow if key.allow is None else key.allow,
                    allow_targets if key.allow_targets is None else key.allow_targets)

    def of(self, tenant: str, key_hash: str | None = None) -> Access:
        """A key's own access when it has one, else its tenant's, else the defaults."""
        if key_hash is not None:
            by_key = self._by_key.get(key_hash)
            if by_key is not None:
                return by_key
        return self._by_tenant.get(tenant, self._default)
