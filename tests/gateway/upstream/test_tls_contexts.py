"""TLS contexts: one per trust store, shared by every https backend, built before the
first request (at start-up and after a reload) instead of on the event loop inside it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import trustme
import yaml

from gateway.policy.admin import RELOADER
from gateway.settings import Settings
from gateway.upstream.tls import is_ready, tls_context
from tests.conftest import StartGateway, single_backend_policy


def bundle(path: Path) -> str:
    trustme.CA().cert_pem.write_to_path(str(path))
    return str(path)


def test_backends_trusting_the_same_cas_share_one_context(tmp_path: Path) -> None:
    assert tls_context() is tls_context()
    ca_file = bundle(tmp_path / "ca.pem")
    assert tls_context(ca_file) is tls_context(ca_file)
    assert tls_context(ca_file) is not tls_context()


def test_a_rotated_ca_bundle_is_read_again(tmp_path: Path) -> None:
    ca_file = bundle(tmp_path / "ca.pem")
    before = tls_context(ca_file)
    bundle(tmp_path / "ca.pem")  # a new CA in the same place
    stat = os.stat(ca_file)
    os.utime(ca_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert not is_ready(ca_file)
    assert tls_context(ca_file) is not before


async def test_an_https_backends_context_is_ready_before_the_first_request(
        start_gateway: StartGateway, tmp_path: Path) -> None:
    ca_file = bundle(tmp_path / "startup.pem")
    policy = single_backend_policy("https://127.0.0.1:9/v1")
    policy["backends"]["up"]["ca_file"] = ca_file
    assert not is_ready(ca_file)
    await start_gateway(policy)
    assert is_ready(ca_file)


async def test_a_reloaded_policys_contexts_are_built_in_the_background(
        start_gateway: StartGateway, tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(single_backend_policy("http://127.0.0.1:9/v1")))
    gateway = await start_gateway(path.read_text(), Settings(
        port=0, policy_path=path, watch_policy=False, supervise=False))
    ca_file = bundle(tmp_path / "reloaded.pem")
    policy = single_backend_policy("https://127.0.0.1:9/v1")
    policy["backends"]["up"]["ca_file"] = ca_file
    path.write_text(yaml.safe_dump(policy))
    result = await gateway.app[RELOADER].reload("test")
    assert result.changed
    for _ in range(200):
        if is_ready(ca_file):
            break
        await asyncio.sleep(0.01)
    assert is_ready(ca_file)
