"""`routegate policy check` reports a managed key whose hash the policy file lists too."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import yaml

from gateway.commands.policy import check_files
from gateway.keys.record import KeyRecord
from gateway.keys.sqlite_store import SqliteKeyStore
from tests.gateway.keys.admin_client import POLICY_KEY, keys_policy, sha


def _check(policy_path: Path, data_dir: Path) -> tuple[int, str]:
    out = io.StringIO()
    code = check_files([str(policy_path)], strict=True, out=out, keys=True,
                       environ={"ROUTEGATE_DATA_DIR": str(data_dir)})
    return code, out.getvalue()


def test_a_managed_key_with_a_policy_keys_hash_is_reported(tmp_path: Path) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(keys_policy("http://127.0.0.1:9/v1")))
    assert _check(policy_path, tmp_path)[0] == 0  # no store written: nothing to clash with

    async def write() -> None:
        store = SqliteKeyStore(tmp_path / "keys.sqlite3")
        await store.create(KeyRecord("key_1", sha(POLICY_KEY), "globex"))
        await store.create(KeyRecord("key_2", sha("another"), "acme"))
        await store.aclose()

    asyncio.run(write())
    code, out = _check(policy_path, tmp_path)
    assert code == 1
    assert "warning:" in out and "managed key key_1 (tenant globex)" in out
    assert "key_2" not in out


def test_the_check_stays_offline_unless_asked_to_look_at_the_keys(tmp_path: Path) -> None:
    """A policy naming a Redis that cannot be reached (CI, a laptop) checks clean."""
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(keys_policy("http://127.0.0.1:9/v1")))
    out = io.StringIO()
    unreachable = {"ROUTEGATE_REDIS_URL": "redis://127.0.0.1:9/0",
                   "ROUTEGATE_DATA_DIR": str(tmp_path)}
    assert check_files([str(policy_path)], strict=True, out=out, environ=unreachable) == 0
    asked = io.StringIO()
    assert check_files([str(policy_path)], strict=True, out=asked, environ=unreachable,
                       keys=True) == 1
    assert "managed keys not checked for clashes" in asked.getvalue()
