"""File models → policy YAML: the inverse of `load`, for tooling and the admin API."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import SecretStr

from policies.schema import PolicyFile

MASK = "**********"


def _plain(value: Any, reveal_secrets: bool) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value() if reveal_secrets else MASK
    if isinstance(value, dict):
        return {key: _plain(item, reveal_secrets) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item, reveal_secrets) for item in value]
    return value


def as_data(policy_file: PolicyFile, *, reveal_secrets: bool = False) -> dict[str, Any]:
    """Plain data (JSON-able) of the settings that differ from their defaults.

    Secrets are masked unless `reveal_secrets`; only round-trip tooling reveals them.
    """
    data = policy_file.model_dump(mode="python", exclude_defaults=True)
    data["version"] = policy_file.version  # required, so always written
    result: dict[str, Any] = _plain(data, reveal_secrets)
    return result


def dump(policy_file: PolicyFile, *, reveal_secrets: bool = False) -> str:
    """YAML text that loads back into an equal `PolicyFile` (with `reveal_secrets`).

    Values are written as they are: a string containing `${` would be read back
    as an environment reference.
    """
    data = as_data(policy_file, reveal_secrets=reveal_secrets)
    ordered = {"version": data.pop("version"), **data}
    # Non-ASCII is escaped: line-break characters such as U+0085 must survive any parser.
    text: str = yaml.safe_dump(ordered, sort_keys=False, allow_unicode=False)
    return text
