"""`policy check`: a managed key whose hash the policy file lists too. The policy file's
key wins (it is looked up first), so the managed key's tenant, limits and budgets are
silently not the ones that apply: worth a warning before the file goes live."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from gateway.keys.install import store_for
from gateway.keys.record import KeyRecord
from gateway.keys.store import KeyStoreUnavailable
from gateway.settings import default_data_dir
from policies.errors import PolicyIssue
from policies.load import Policy

CHECK_TIMEOUT_S = 5.0


def clashes(policy: Policy, records: Iterable[KeyRecord]) -> list[PolicyIssue]:
    found = []
    listed = {**policy.tenant_by_key_hash, **dict.fromkeys(policy.admin_key_hashes, "admin")}
    for record in records:
        if record.revoked_at is not None:
            continue
        for digest in (record.key_hash, record.previous_hash):
            if digest is not None and digest in listed:
                found.append(PolicyIssue(
                    f"managed key {record.id} (tenant {record.tenant}) has a hash the policy "
                    f"lists too (as {listed[digest]}'s): the policy's entry wins; revoke one",
                    policy.source))
    return found


def store_clashes(policy: Policy, environ: Mapping[str, str]) -> list[PolicyIssue]:
    """Clashes with the keys in the store the policy names (an embedded store that was
    never written: none); an unreachable store is a warning of its own."""
    data_dir = default_data_dir(environ)
    redis_url = environ.get("ROUTEGATE_REDIS_URL")
    settings = policy.file.keys
    if redis_url is None and settings.store == "embedded" \
            and not (data_dir / "keys.sqlite3").exists():
        return []
    store = store_for(settings.store, data_dir, redis_url)

    async def read() -> list[KeyRecord]:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                return (await store.snapshot())[0]
        finally:
            await store.aclose()

    try:
        return clashes(policy, asyncio.run(read()))
    except (KeyStoreUnavailable, TimeoutError) as exc:
        return [PolicyIssue(f"managed keys not checked for clashes: {exc}", policy.source)]
