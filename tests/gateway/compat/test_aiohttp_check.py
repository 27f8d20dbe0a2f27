"""`check_aiohttp`: the installed aiohttp passes; any release outside the supported range,
or one lacking a private name the gateway uses, is refused with an error naming both."""

from __future__ import annotations

import tomllib
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.compat.aiohttp import (
    SUPPORTED,
    IncompatibleAiohttp,
    check_aiohttp,
    missing_names,
)

ROOT = Path(__file__).resolve().parents[3]


def test_the_installed_aiohttp_passes() -> None:
    check_aiohttp()
    check_aiohttp(aiohttp.__version__)


def test_the_installed_aiohttp_has_every_name_the_gateway_uses() -> None:
    assert missing_names() == []


@pytest.mark.parametrize("version", ["3.14.0", "3.14.5", "3.14.99", "3.14.6.post1"])
def test_a_release_inside_the_range_passes(version: str) -> None:
    check_aiohttp(version)


@pytest.mark.parametrize("version", ["3.13.5", "3.9.0", "3.15.0", "3.15.0a1", "4.0.0"])
def test_a_release_outside_the_range_is_refused_naming_both_versions(version: str) -> None:
    with pytest.raises(IncompatibleAiohttp) as refused:
        check_aiohttp(version)
    message = str(refused.value)
    assert f"aiohttp {version} is installed" in message
    assert f"needs aiohttp {SUPPORTED}" in message
    assert "gateway/compat/aiohttp.py" in message


def test_something_that_is_not_a_version_is_refused() -> None:
    with pytest.raises(IncompatibleAiohttp, match="not a version number"):
        check_aiohttp("unknown")


def test_a_missing_private_name_is_named_by_its_class() -> None:
    assert missing_names([(web.StreamResponse, "_eof_sent"),
                          (web.StreamResponse, "_no_such_attribute")]) == [
        "StreamResponse._no_such_attribute"]


def test_the_range_is_the_one_pyproject_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"aiohttp{SUPPORTED}" in project["dependencies"]

